package actors

import (
	"context"
	"testing"
)

// BenchmarkRecordLifecycle is a call's bookkeeping on its record without a lane: take a
// record, start the call, settle it, take the caller's token, and let both holders go.
// Every step is on the call path of Task.Call.
func BenchmarkRecordLifecycle(b *testing.B) {
	task := defineTest(b, double, Options{})
	ctx := context.Background()
	b.ReportAllocs()
	for i := range b.N {
		r, err := task.Records.Alloc()
		if err != nil {
			b.Fatal(err)
		}
		r.Start(ctx, i, 1)
		r.Resolve(2 * i)
		<-r.Done()
		task.Records.Release(r) // the lane's
		task.Records.Release(r) // the caller's
	}
}
