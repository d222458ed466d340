package knit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit"
)

// Precise settlement (docs/lifecycle.md, "When a lane dies"): a lane's death costs only the
// call it was running. The tasks (tasks_test.go) count their runs in a file that the test and
// every lane process map, so the test can tell how often each call really ran.

// With the default Config, a burst of calls that kill their lanes costs only the calls
// that were running: calls that had not started run elsewhere, Idempotent ones run again,
// no call runs twice unless it is Idempotent and its lane died under it, and the pool
// serves on every lane afterwards.
func TestChaosDefaultConfig(t *testing.T) {
	calls := 128_000
	if testing.Short() {
		calls = 16_000
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "runs")
	if err := os.WriteFile(path, make([]byte, 4*calls), 0o600); err != nil {
		t.Fatal(err)
	}
	runs, err := mapRuns(path)
	if err != nil {
		t.Fatal(err)
	}
	var deaths atomic.Int64
	died := make(chan struct{}, 1)
	p, err := knit.NewPool(knit.Config{Lanes: 4, Runtime: knit.Process, Logger: zap.NewNop(),
		Process: knit.ProcessConfig{Env: []string{envRuns + "=" + path}},
		OnEvent: func(e knit.Event) {
			if e.Lane >= 0 && (e.To == knit.StateCrashed || e.To == knit.StateExited) {
				deaths.Add(1)
				select {
				case died <- struct{}{}:
				default:
				}
			}
		}}, chaosOnce, chaosIdem)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())

	var failedOnce, idemFailed atomic.Int64
	var wrong atomic.Value
	var wg sync.WaitGroup
	const goroutines = 32
	per := calls / goroutines
	for g := range goroutines {
		wg.Go(func() {
			for i := range per {
				id := g*per + i
				c := chaosCall{ID: id, Die: id%2000 == 1999}
				idem := id%2 == 0
				task := chaosOnce
				if idem {
					task = chaosIdem
				}
				got, err := task.Call(context.Background(), p, c)
				var ke *knit.Error
				switch {
				case err == nil && got != 2*id:
					wrong.Store(fmt.Sprintf("call %d returned %d", id, got))
				case err != nil && idem:
					idemFailed.Add(1)
					wrong.Store(fmt.Sprintf("idempotent call %d failed: %v", id, err))
				case err != nil && !errors.As(err, &ke):
					wrong.Store(fmt.Sprintf("call %d: uncoded error %v", id, err))
				case err != nil && !ke.Started:
					wrong.Store(fmt.Sprintf("call %d failed although it had not started: %v", id, err))
				case err != nil:
					failedOnce.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if w := wrong.Load(); w != nil {
		t.Fatal(w)
	}
	for id := 1; id < calls; id += 2 { // the non-idempotent calls
		if r := runs[id].Load(); r > 1 {
			t.Errorf("non-idempotent call %d ran %d times", id, r)
		}
	}
	// The pool serves on every lane afterwards.
	rec := make(chan struct{})
	go func() {
		defer close(rec)
		for !allReady(p) {
			if _, err := chaosOnce.Call(context.Background(), p, chaosCall{ID: 0}); err != nil {
				t.Errorf("call after the chaos: %v", err)
				return
			}
		}
	}()
	<-rec
	var after sync.WaitGroup
	for range 256 {
		after.Go(func() {
			if _, err := chaosOnce.Call(context.Background(), p, chaosCall{ID: 0}); err != nil {
				t.Errorf("call after the chaos: %v", err)
			}
		})
	}
	after.Wait()
	// A call fails before its lane's end is an event, and the last lane a chaos call killed
	// may not have reported its end yet: wait for the events (each failed call is a death),
	// and judge the count that arrived when the wait gives up.
	for giveUp := time.After(time.Minute); deaths.Load() < failedOnce.Load(); {
		select {
		case <-died:
			continue
		case <-giveUp:
		}
		break
	}
	n := deaths.Load()
	t.Logf("%d calls, %d lane deaths, %d non-idempotent calls failed", calls, n, failedOnce.Load())
	if n == 0 {
		t.Fatal("no lane died")
	}
	if f := failedOnce.Load(); f > n {
		t.Errorf("%d non-idempotent calls failed for %d lane deaths: more than the calls that were running", f, n)
	}
	// A lane the last chaos calls killed may have been seen ready above, before its end was
	// an event: it comes back within the restart backoff.
	for deadline := time.Now().Add(time.Minute); !allReady(p) && time.Now().Before(deadline); {
		if _, err := chaosOnce.Call(context.Background(), p, chaosCall{ID: 0}); err != nil {
			t.Errorf("call after the chaos: %v", err)
			break
		}
	}
	for i, l := range p.Stats().Lanes {
		if l.State != knit.StateReady {
			t.Errorf("lane %d is %v after the chaos", i, l.State)
		}
	}
}

// A call that kills every lane it runs on fails as poison after at most two lane deaths,
// and the other lanes never stop serving.
func TestPoisonCall(t *testing.T) {
	var deaths atomic.Int64
	p := newProcessPool(t, knit.Config{Lanes: 3, Logger: quiet(), OnEvent: func(e knit.Event) {
		if e.Lane >= 0 && e.To == knit.StateCrashed {
			deaths.Add(1)
		}
	}}, alwaysDies, add)
	stop := make(chan struct{})
	var served atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Only the poison call ever runs when a lane dies: the calls behind it had
				// not started and run elsewhere.
				if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil {
					t.Errorf("a call of a healthy task failed: %v", err)
				}
				served.Add(1)
			}
		})
	}
	_, err := alwaysDies.Call(context.Background(), p, 0)
	close(stop)
	wg.Wait()
	if !errors.Is(err, knit.ErrPoisonCall) {
		t.Fatalf("poison call: %v, want %s", err, knit.CodePoisonCall)
	}
	if n := deaths.Load(); n > 2 {
		t.Errorf("the poison call killed %d lanes, want at most 2", n)
	}
	if served.Load() == 0 {
		t.Error("the other lanes served nothing")
	}
	var ke *knit.Error
	if errors.As(err, &ke) && !ke.Started {
		t.Errorf("poison error says the call had not started: %v", err)
	}
}

// TestCancelStormLeavesNothingBehind: 100,000 calls to one process lane whose callers give
// up right after Go leave its backlog without running, so a fresh call after the storm waits
// for at most the few cancelled calls the lane had started, not for every queued one to run
// (each takes 5 ms whatever its context says: thousands of them kept the lane busy for
// minutes after a storm).
func TestCancelStormLeavesNothingBehind(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet()}, stubbornNap, add)
	const storm = 100_000
	futures := make([]*knit.Future[int], 0, storm)
	for i := range storm {
		ctx, cancel := context.WithCancel(context.Background())
		futures = append(futures, stubbornNap.Go(ctx, p, i))
		cancel()
	}
	before := p.Stats().Lanes[0].Completed // what ran during the storm
	if sum, err := add.Call(context.Background(), p, [2]int64{2, 3}); err != nil || sum != 5 {
		t.Fatalf("a fresh call after the storm: %d, %v", sum, err)
	}
	// The fresh call ran after whatever the lane held (the batch it had taken and its ring,
	// 32 calls each at most) and nothing of the backlog; the count includes the fresh call
	// itself, so 65 at most.
	if after := p.Stats().Lanes[0].Completed - before; after > 2*32+1 {
		t.Errorf("the lane ran %d calls after the storm ended before a fresh one", after)
	}
	for i, f := range futures {
		if _, err := f.Wait(); !errors.Is(err, knit.ErrCanceled) && !errors.Is(err, knit.ErrOverloaded) && err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}
