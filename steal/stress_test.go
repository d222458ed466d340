package steal

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestStressDeaths: several goroutine consumers claim from one ring while the host
// publishes; consumers die at random points of the protocol (mid-claim, holding an
// unreleased batch, between start and result, between result and finish), the host
// recovers each, publishes its fresh calls again, fails its started ones (unless their
// result already settled them) and starts a new consumer with the same id. Every call
// settles exactly once, and no call starts twice.
func TestStressDeaths(t *testing.T) {
	for _, d := range disciplines {
		for _, n := range []int{2, 4} {
			t.Run(d.String()+"/"+string(rune('0'+n)), func(t *testing.T) { stress(t, d, n) })
		}
	}
}

type stressEvent struct {
	call int // result of call; -1: consumer died
	who  int
}

func stress(t *testing.T, d Discipline, n int) {
	calls := 20000
	if testing.Short() || raceEnabled {
		calls = 5000
	}
	const maxDeaths = 40
	r := newRing(t, Config{Consumers: n, Discipline: d})
	p := r.Producer(nil)
	started := make([]atomic.Int32, calls)
	settled := make([]int, calls) // host only
	events := make(chan stressEvent, 64)
	var stop atomic.Bool
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(1, uint64(n)*uint64(d)))
	deaths, doomed := 0, 0

	run := func(id int, dieAt int) {
		defer wg.Done()
		c, err := r.Consumer(id, nil)
		if err != nil {
			t.Error(err)
			return
		}
		steps := 0
		die := func() bool {
			steps++
			if steps == dieAt {
				events <- stressEvent{call: -1, who: id}
				return true
			}
			return false
		}
		for !stop.Load() {
			// Claim step by step, the way Claim does, so that death can strike at any step.
			c.n = 0
			c.cl.begin(&r.g)
			spins := 0
			var st status
			for {
				if die() {
					return
				}
				st = c.cl.step(&c.m, &r.g, id, spins > spinLimit)
				if st == blocked {
					spins++
					runtime.Gosched()
				}
				if st != running && st != blocked {
					break
				}
			}
			if st != committed {
				runtime.Gosched()
				continue
			}
			c.n, c.held = int(c.cl.n), true
			for k := range c.n {
				c.order[k], c.state[k] = uint8(k), entryClaimed
			}
			ids := make([]int, c.n)
			for k := range c.n {
				ids[k] = int(c.Slot(k).Call())
			}
			if die() {
				return
			}
			c.Release()
			for k := range c.n {
				if die() {
					return
				}
				c.Start(k)
				if started[ids[k]].Add(1) != 1 {
					t.Errorf("call %d started twice", ids[k])
				}
				if die() {
					return
				}
				events <- stressEvent{call: ids[k], who: id}
				if die() {
					return
				}
				c.Finish(k)
			}
		}
	}
	spawn := func(id int) {
		dieAt := 0
		if doomed < maxDeaths && (doomed == 0 || rng.IntN(4) != 0) {
			dieAt = 1 + rng.IntN(300)
			doomed++
		}
		wg.Add(1)
		go run(id, dieAt)
	}
	for id := range n {
		spawn(id)
	}

	callOf := map[uint64]int{}
	queue := make([]int, 0, calls)
	for i := range calls {
		queue = append(queue, i)
	}
	done := 0
	settle := func(call int, why string) {
		settled[call]++
		if settled[call] > 1 {
			t.Errorf("call %d settled twice (%s)", call, why)
		}
		done++
	}
	for done < calls && !t.Failed() {
		// Publish what fits.
		for len(queue) > 0 {
			slot, ok := p.Reserve()
			if !ok {
				break
			}
			call := queue[0]
			queue = queue[1:]
			p.Slot(slot).SetCall(uint32(call), 0)
			if _, err := p.Put(slot, 0); err != nil {
				t.Fatal(err)
			}
			callOf[p.Stage(slot)] = call
		}
		p.Flush()
		select {
		case ev := <-events:
			if ev.call >= 0 {
				settle(ev.call, "result")
				continue
			}
			deaths++
			rec, err := p.Recover(ev.who)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range rec.Fresh {
				call, ok := callOf[c.Seq]
				if !ok || started[call].Load() != 0 {
					t.Fatalf("fresh call %+v (call %d) unknown or started", c, call)
				}
				queue = append(queue, call)
			}
			for _, c := range rec.Started {
				call := callOf[c.Seq]
				if started[call].Load() != 1 {
					t.Fatalf("started call %d started %d times", call, started[call].Load())
				}
				if settled[call] == 0 {
					settle(call, "failed after death")
				}
			}
			p.Activate(ev.who)
			spawn(ev.who)
		default:
			runtime.Gosched()
		}
	}
	stop.Store(true)
	go func() {
		wg.Wait()
		close(events)
	}()
	for range events { // drain: a dying consumer may still be reporting
	}
	for call, s := range settled {
		if s != 1 {
			t.Fatalf("call %d settled %d times", call, s)
		}
	}
	if deaths == 0 {
		t.Fatal("no consumer died: the test did not test recovery")
	}
	t.Logf("%v, %d consumers: %d calls, %d deaths", d, n, calls, deaths)
}
