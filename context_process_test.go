package knit_test

import (
	"context"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// deadlineOf reports the deadline a task's context carries, in Unix nanoseconds (0: none).
var deadlineOf = knit.Define("test.deadlineOf", func(ctx context.Context, _ int) (int64, error) {
	d, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	return d.UnixNano(), nil
})

// A task on a process lane sees its caller's deadline; a call without one has none.
func TestProcessLaneSeesCallerDeadline(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1}, deadlineOf)
	want := time.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), want)
	defer cancel()
	got, err := deadlineOf.Call(ctx, p, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != want.UnixNano() {
		t.Fatalf("lane saw deadline %v, caller's is %v", time.Unix(0, got), want)
	}
	got, err = deadlineOf.Call(context.Background(), p, 0)
	if err != nil || got != 0 {
		t.Fatalf("without a deadline: %d, %v", got, err)
	}
}
