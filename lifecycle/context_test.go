package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/futex"
	"github.com/knitgo/knit/internal/shm"
)

func newWatch(t *testing.T) (*abortWatch, *fastpath.Region) {
	t.Helper()
	l := fastpath.Layout{Arena: 4096, AbortBits: 64}
	r, err := fastpath.NewRegion(shm.Heap(l.Size()), l, 0, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	w := newAbortWatch(r)
	t.Cleanup(func() {
		w.stop()
		goleak.VerifyNone(t)
	})
	return w, r
}

// A process lane's call context carries the caller's deadline, and says why it ended.
func TestCallContextDeadline(t *testing.T) {
	w, _ := newWatch(t)
	want := time.Now().Add(time.Hour).Round(0)
	ctx, end := w.context(-1, want.UnixNano(), nil)
	if d, ok := ctx.Deadline(); !ok || !d.Equal(want) {
		t.Fatalf("Deadline() = %v, %v; want %v", d, ok, want)
	}
	end()

	ctx, end = w.context(3, time.Now().Add(-time.Second).UnixNano(), nil)
	defer end()
	<-ctx.Done()
	if cause := context.Cause(ctx); cause != ErrCallerDeadline || !errors.Is(cause, context.DeadlineExceeded) {
		t.Fatalf("cause %v, want ErrCallerDeadline wrapping DeadlineExceeded", cause)
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err() = %v", ctx.Err())
	}
}

func TestCallContextAbort(t *testing.T) {
	w, r := newWatch(t)
	ctx, end := w.context(5, 0, nil)
	defer end()
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("a call without a deadline got one")
	}
	r.Aborts().Set(5)
	r.AbortWake().Add(1)
	_, _ = futex.Wake(r.AbortWake(), 1)
	<-ctx.Done()
	if cause := context.Cause(ctx); cause != ErrCallerCanceled || !errors.Is(cause, context.Canceled) {
		t.Fatalf("cause %v, want ErrCallerCanceled", cause)
	}

	// An ended call's context is cancelled without a cause of its own.
	ctx2, end2 := w.context(2, 0, nil)
	end2()
	if context.Cause(ctx2) != context.Canceled {
		t.Fatalf("cause after end: %v", context.Cause(ctx2))
	}
}
