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

// BenchmarkTableGet is the lookup a lane's result (SettleResult) and a goroutine lane's
// run (RunLocal) make on every call: a record by the index a slot names. "few" looks up the
// first records in turn (a task with a few calls in flight, the usual case: freed records
// are reused first), "many" records spread over 3,000.
func BenchmarkTableGet(b *testing.B) {
	task := defineTest(b, double, Options{})
	ctx := context.Background()
	var ids []uint32
	for i := range 3000 {
		r := startCall(b, task, ctx, i, 1, 0)
		ids = append(ids, r.ID)
		b.Cleanup(func() { releaseCall(task, r) })
	}
	for _, bc := range []struct {
		name  string
		probe [8]uint32
	}{
		{"few", [8]uint32{ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7]}},
		{"many", [8]uint32{ids[0], ids[1], ids[7], ids[20], ids[100], ids[1500], ids[2999], ids[3]}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var sink *Record[int, int]
			i := 0
			for b.Loop() {
				sink = task.Records.Get(bc.probe[i&7])
				i++
			}
			if sink == nil {
				b.Fatal("Get found no record")
			}
		})
	}
}
