package knit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// Resize: lanes are added and retired under load without losing a call or running one twice,
// counted as in recycle_test.go (the load and its checks are in helpers_test.go).

// Resize under load, goroutine and process lanes: 64 goroutines call continuously while the
// pool grows from 2 to 8 lanes and shrinks back to 2. No call fails, is lost, or runs twice.
func TestResizeUnderLoad(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		t.Run(rt.String(), func(t *testing.T) {
			const ids = 1 << 20
			var runs []atomic.Uint32
			var task func(p *knit.Pool) func(int) (int, error)
			cfg := knit.Config{Lanes: 2, Runtime: rt, Logger: quiet()}
			w := newLifeWatch()
			cfg.OnEvent = w.on
			if rt == knit.Process {
				var path string
				path, runs = fileRuns(t, ids)
				cfg.Process.Env = []string{envRuns + "=" + path}
				task = func(p *knit.Pool) func(int) (int, error) {
					return func(id int) (int, error) { return chaosOnce.Call(context.Background(), p, chaosCall{ID: id}) }
				}
			} else {
				runs = memRuns(ids)
				task = func(p *knit.Pool) func(int) (int, error) {
					return func(id int) (int, error) { return counted.Call(context.Background(), p, id) }
				}
			}
			p, err := knit.NewPool(cfg, chaosOnce, counted)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			ld := startLoad(64, ids, task(p))
			ld.until(500)
			if err := p.Resize(context.Background(), 8); err != nil {
				t.Fatalf("grow: %v", err)
			}
			st := p.Stats()
			if len(st.Lanes) != 8 || !allReady(p) {
				t.Fatalf("after growing to 8: %+v", st.Lanes)
			}
			ld.until(2000) // the new lanes take calls
			if err := p.Resize(context.Background(), 2); err != nil {
				t.Fatalf("shrink: %v", err)
			}
			if st := p.Stats(); len(st.Lanes) != 2 || !allReady(p) {
				t.Fatalf("after shrinking to 2: %+v", st.Lanes)
			}
			ld.until(500)
			n := ld.finish(t)
			checkRuns(t, runs, n)
			events, _ := w.snapshot()
			added, retired, removed := 0, 0, 0
			for _, e := range events {
				switch {
				case e.To == knit.StateBooting && strings.HasPrefix(e.Reason, "added"):
					added++
				case e.To == knit.StateRetiring:
					retired++
				case e.To == knit.StateRemoved:
					removed++
				case e.To == knit.StateCrashed || e.To == knit.StateRestarting:
					t.Errorf("event %+v while resizing", e)
				}
			}
			t.Logf("%d calls; lanes added %d, retired %d, removed %d", n, added, retired, removed)
			if added != 6 || retired != 6 || removed != 6 {
				t.Errorf("lanes added %d, retired %d, removed %d: want 6 each", added, retired, removed)
			}
		})
	}
}

// Resize racing Close, goroutine and process lanes: every Resize returns nil or
// POOL_CLOSED, Close settles everything (goleak checks that nothing is left running), calls
// succeed or fail with POOL_CLOSED, none runs twice, and a Resize after Close fails with
// POOL_CLOSED.
func TestResizeRacingClose(t *testing.T) {
	type round struct {
		rt       knit.Runtime
		from, to int
		mid      bool // Close once the resize is under way (a lane added is booting, or one retires)
	}
	rounds := []round{{knit.Goroutine, 2, 6, false}, {knit.Goroutine, 6, 1, false}, {knit.Goroutine, 3, 8, true}, {knit.Goroutine, 8, 2, true},
		{knit.Process, 2, 5, true}, {knit.Process, 5, 1, true}}
	for _, r := range rounds {
		t.Run(fmt.Sprintf("%v-%dto%d-mid=%v", r.rt, r.from, r.to, r.mid), func(t *testing.T) {
			const ids = 1 << 16
			underway := make(chan struct{})
			var once sync.Once
			// StopAckTimeout: a machine busy enough may hold a lane past the default 50ms;
			// a lane that never acknowledges still fails the test, later.
			cfg := knit.Config{Lanes: r.from, Runtime: r.rt, Logger: quiet(), StopAckTimeout: 10 * time.Second, OnEvent: func(e knit.Event) {
				if e.To == knit.StateRetiring || e.To == knit.StateBooting && strings.HasPrefix(e.Reason, "added") {
					once.Do(func() { close(underway) })
				}
			}}
			var runs []atomic.Uint32
			if r.rt == knit.Process {
				var path string
				path, runs = fileRuns(t, ids)
				cfg.Process.Env = []string{envRuns + "=" + path}
			} else {
				runs = memRuns(ids)
			}
			p, err := knit.NewPool(cfg, counted, chaosOnce)
			if err != nil {
				t.Fatal(err)
			}
			var closed atomic.Int64
			ld := startLoad(16, ids, func(id int) (int, error) {
				var got int
				var err error
				if r.rt == knit.Process {
					got, err = chaosOnce.Call(context.Background(), p, chaosCall{ID: id})
				} else {
					got, err = counted.Call(context.Background(), p, id)
				}
				if errors.Is(err, knit.ErrPoolClosed) {
					closed.Add(1)
					return 0, errStopLoad
				}
				return got, err
			})
			ld.until(200)
			var wg sync.WaitGroup
			var rerr, cerr error
			wg.Go(func() { rerr = p.Resize(context.Background(), r.to) })
			if r.mid {
				<-underway
			}
			cerr = p.Close(context.Background())
			wg.Wait()
			n := ld.finish(t)
			if rerr != nil && !errors.Is(rerr, knit.ErrPoolClosed) {
				t.Errorf("Resize racing Close: %v", rerr)
			}
			if cerr != nil {
				t.Errorf("Close: %v", cerr)
			}
			err = p.Resize(context.Background(), 4)
			var ke *knit.Error
			if !errors.As(err, &ke) || ke.Code != knit.CodePoolClosed {
				t.Errorf("Resize after Close: %v, want POOL_CLOSED", err)
			}
			for id := range n {
				if r := runs[id].Load(); r > 1 {
					t.Errorf("call %d ran %d times", id, r)
				}
			}
			t.Logf("%d calls, %d refused as closed; Resize: %v", n, closed.Load(), rerr)
		})
	}
}

// A retiring lane finishes the call it holds before Resize returns; when Resize's context
// ends first, the lane is stopped at once through the stop protocol (a goroutine lane whose
// task does not return is abandoned: its call fails with THREAD_CLOSED) and Resize returns
// CANCELED.
func TestResizeShrinkFinishesHeldCalls(t *testing.T) {
	for _, cancelFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancel=%v", cancelFirst), func(t *testing.T) {
			retiring := make(chan struct{})
			var once sync.Once
			// Private lanes: the test places calls on given lanes.
			p := newPool(t, knit.Config{Lanes: 2, Logger: quiet(), Steal: knit.StealOff, OnEvent: func(e knit.Event) {
				if e.Lane == 1 && e.To == knit.StateRetiring {
					once.Do(func() { close(retiring) })
				}
			}})
			g0, g1 := newGate(), newGate()
			f0 := block.Go(context.Background(), p, g0)
			<-g0.started // lane 0 is busy: the next call goes to lane 1
			f1 := block.Go(context.Background(), p, g1)
			<-g1.started
			if st := p.Stats().Lanes; st[1].InFlight != 1 {
				t.Fatalf("lane 1 holds %d calls, want the blocked one", st[1].InFlight)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resized := make(chan error, 1)
			go func() { resized <- p.Resize(ctx, 1) }()
			<-retiring
			// A call now goes to lane 0, which is busy, rather than to the retiring lane.
			f2 := add.Go(context.Background(), p, [2]int64{1, 1})
			if cancelFirst {
				cancel()
				err := <-resized
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Resize with its context cancelled: %v", err)
				}
				if _, err := f1.Wait(); !errors.Is(err, knit.ErrThreadClosed) {
					t.Errorf("the call of the lane stopped at once: %v, want THREAD_CLOSED", err)
				}
				close(g1.open) // the abandoned goroutine ends
			} else {
				close(g1.open)
				if err := <-resized; err != nil {
					t.Fatalf("Resize: %v", err)
				}
				select {
				case <-f1.Done():
				default:
					t.Error("Resize returned before the retiring lane's call settled")
				}
				if got, err := f1.Wait(); err != nil || got != "opened" {
					t.Errorf("the retiring lane's call: %q, %v", got, err)
				}
			}
			close(g0.open)
			if got, err := f0.Wait(); err != nil || got != "opened" {
				t.Errorf("lane 0's call: %q, %v", got, err)
			}
			if got, err := f2.Wait(); err != nil || got != 2 {
				t.Errorf("a call made while lane 1 retired: %d, %v", got, err)
			}
			if n := len(p.Stats().Lanes); n != 1 {
				t.Errorf("%d lanes after Resize(1)", n)
			}
		})
	}
}
