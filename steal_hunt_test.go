package knit_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// TestStealDekkerStallHunt hunts a stall seen once in the harness (docs/benchmarks.md,
// "Callers yield too"): over 4 process lanes stealing with Dekker, a window of 1024 futures,
// KNIT_HUNT pools of 1M calls each, it fails with the pool's state (StealState) as soon as no
// call completes for 0.5 s, and logs the state again while the stall lasts. It is opt-in (a
// diagnostic, not a gate: 0.5 s without a result on a loaded machine is not a bug by itself).
// Seen twice in 375 pools; the second dump showed a lane rung (awake word 2) with a call
// unread on its own ring for more than 0.5 s, 1 s into the stall: a lane that waited marked
// rung, which fastpath.Wake.Park no longer does (TestParkNeverWaitsRung, TestStealWakeModel).
func TestStealDekkerStallHunt(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KNIT_HUNT"))
	if n == 0 {
		t.Skip("KNIT_HUNT=<pools> runs it")
	}
	for round := range n {
		p, err := knit.NewPool(knit.Config{Lanes: 4, Runtime: knit.Process, Steal: knit.StealDekker, Logger: quiet()}, add)
		if err != nil {
			t.Fatal(err)
		}
		var done atomic.Int64
		stop, watched := make(chan struct{}), make(chan struct{})
		var stalled atomic.Pointer[string]
		go func() {
			defer close(watched)
			last, quiet := int64(-1), 0
			tk := time.NewTicker(250 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
				}
				if d := done.Load(); d != last {
					last, quiet = d, 0
					continue
				}
				if quiet++; quiet >= 2 && quiet%2 == 0 {
					msg := fmt.Sprintf("%v: round %d after %d calls: %s; %+v", time.Now().Format("15:04:05.000"),
						round, last, knit.StealState(p), p.Stats().Lanes)
					t.Log(msg)
					stalled.CompareAndSwap(nil, &msg)
				}
			}
		}()
		const w, calls = 1024, 1_000_000
		ctx := context.Background()
		ring := make([]*knit.Future[int64], w)
		for i := range w {
			ring[i] = add.Go(ctx, p, [2]int64{int64(i), 1})
		}
		for i := range calls {
			s := i % w
			if _, err := ring[s].Wait(); err != nil {
				t.Fatal(err)
			}
			done.Add(1)
			if msg := stalled.Load(); msg != nil {
				close(stop)
				<-watched
				_ = p.Close(context.Background())
				t.Fatalf("stalled: %s; resumed at %v", *msg, time.Now().Format("15:04:05.000"))
			}
			if i+w < calls {
				ring[s] = add.Go(ctx, p, [2]int64{int64(i), 1})
			}
		}
		close(stop)
		<-watched
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
