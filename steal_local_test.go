package knit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// Tests of StealLocal, the stealing of goroutine lanes (actors.LocalGroup): each lane keeps
// its own queue and one that has run dry takes the calls waiting on a stuck one.

// With RoundRobin, half the calls go to a lane stuck in a call that does not end: the free
// lane takes them, and every call settles while the stuck one still runs. With StealOff
// the same calls would wait for the stuck one.
func TestStealLocalTakesStuckLanesCalls(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 2, Steal: knit.StealLocal, Balancer: knit.RoundRobin})
	if got := p.Stats().Steal; got != knit.StealLocal {
		t.Fatalf("Stats.Steal = %v, want local", got)
	}
	release := stuckLane(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var futs []*knit.Future[int64]
	for i := range 20 {
		futs = append(futs, add.Go(ctx, p, [2]int64{int64(i), 1}))
	}
	for i, f := range futs {
		if v, err := f.Wait(); err != nil || v != int64(i)+1 {
			t.Fatalf("add %d behind a stuck lane: %d, %v; %+v", i, v, err, p.Stats().Lanes)
		}
	}
	var claimed uint64
	for _, l := range p.Stats().Lanes {
		claimed += l.Claimed
	}
	if claimed == 0 {
		t.Fatal("every add settled, yet no lane took one from the stuck lane")
	}
	if v, err := release(); err != nil || v != "opened" {
		t.Fatalf("stuck call: %q, %v", v, err)
	}
}

// stuckLane starts a call that blocks its lane until release is called (at the latest by
// the test's cleanup, before the pool's Close waits for it), and returns once it runs.
// release returns the call's result.
func stuckLane(t *testing.T, p *knit.Pool) (release func() (string, error)) {
	g := newGate()
	var once sync.Once
	open := func() { once.Do(func() { close(g.open) }) }
	t.Cleanup(open)
	stuck := block.Go(context.Background(), p, g)
	<-g.started
	return func() (string, error) {
		open()
		return stuck.Wait()
	}
}

// One lane is stuck and the other, which takes the calls queued behind it, dies
// (runtime.Goexit in a task) while it may hold calls it stole and calls queued behind the
// Goexit: every call settles once, the adds with their results, the one it died in with
// WORKER_EXITED; the pool serves on.
func TestStealLocalVictimDies(t *testing.T) {
	for round := range 10 {
		p := newPool(t, knit.Config{Lanes: 2, Steal: knit.StealLocal, Balancer: knit.RoundRobin})
		release := stuckLane(t, p)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var futs []*knit.Future[int64]
		for i := range 40 {
			futs = append(futs, add.Go(ctx, p, [2]int64{int64(i), 1}))
			if i == 20 {
				// The free lane runs into a Goexit: it dies while it may hold stolen calls.
				futs = append(futs, nil)
				if _, err := goexit.Call(ctx, p, 0); !errors.Is(err, knit.ErrWorkerExited) {
					t.Fatalf("round %d: goexit: %v", round, err)
				}
			}
		}
		for i, f := range futs {
			if f == nil {
				continue
			}
			want := int64(i) + 1
			if i > 20 {
				want-- // the nil placeholder
			}
			if v, err := f.Wait(); err != nil || v != want {
				t.Fatalf("round %d: add %d: %d, %v", round, i, v, err)
			}
		}
		if v, err := release(); err != nil || v != "opened" {
			t.Fatalf("round %d: stuck call: %q, %v", round, v, err)
		}
		cancel()
	}
}
