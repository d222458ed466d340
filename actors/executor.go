package actors

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"
	"time"

	"github.com/knitgo/knit/fastpath"
)

// Executor is the consumer side of a lane: it takes every pending call from the request
// ring in one pass, retires those slots at once, runs the calls in order and publishes each
// result on the return ring.
type Executor struct {
	Region *fastpath.Region
	Lane   fastpath.Bell // the bell the lane parks on (rung for calls and stop requests)
	Done   fastpath.Bell // the completion doorbell the host may sleep on (nil: never rung)
	// Drain, if set, settles results in the host right after each publish. In-process
	// lanes use it: the lane goroutine hands the result to its caller itself, which keeps
	// a call on one core and needs no wake-up of a third goroutine.
	Drain func()
	Spin  time.Duration // spin budget before parking
	Park  time.Duration // safety-net timeout of a park (0: none)
	// Local runs calls by reference on their records (goroutine lanes); otherwise payloads
	// are decoded and results encoded (process lanes).
	Local bool
	// Tasks maps a slot's function index to its task.
	Tasks []Def
	// Stopping, if set, is called when the lane sees the stop request.
	Stopping func()

	scratch []byte
}

type work struct{ fn, id, gen uint32 }

// Run serves calls until the host requests a stop, which it acknowledges after finishing
// the calls it has taken. An error means the request ring broke the protocol: the lane
// must die.
func (e *Executor) Run() error {
	req, ret := e.Region.Requests().Consumer(), e.Region.Returns().Producer()
	wake, done, stop := e.Region.LaneWake(), e.Region.Returns().Completion(), e.Region.Stop()
	stats := e.Region.Stats()
	ready := func() bool { return req.Poll() != 0 || stop.Load() != fastpath.StopRunning }
	spin := fastpath.Spinner{Budget: e.Spin}
	var batch [fastpath.Slots]work
	var inputs [fastpath.Slots][]byte
	wake.SetAwake()
	for {
		if !spin.Until(ready) {
			wake.Park(e.Lane, ready, e.Park)
		}
		pending := req.Poll()
		if pending == 0 {
			if stop.Load() == fastpath.StopRequested {
				if e.Stopping != nil {
					e.Stopping()
				}
				stop.Store(fastpath.StopAcknowledged)
				return nil
			}
			continue
		}
		n := 0
		for m := pending; m != 0; m &= m - 1 {
			i := bits.TrailingZeros32(m)
			s := req.Slot(i)
			batch[n] = work{fn: s.Fn(), id: s.Call(), gen: s.Gen()}
			if !e.Local {
				p, err := req.Payload(i)
				if err != nil {
					return err
				}
				inputs[n] = append(inputs[n][:0], p...)
			}
			n++
		}
		req.Retire(pending)
		for k := range n {
			w := batch[k]
			if int(w.fn) >= len(e.Tasks) {
				return fmt.Errorf("%w: function index %d of %d", fastpath.ErrCorrupt, w.fn, len(e.Tasks))
			}
			t := e.Tasks[w.fn]
			var out []byte
			var o Outcome
			if e.Local {
				o = t.RunLocal(w.id, w.gen)
			} else {
				e.scratch, o = t.RunEncoded(context.Background(), inputs[k], e.scratch[:0])
				out = e.scratch
			}
			if o == OK {
				stats.Completed.Add(1)
			} else {
				stats.Failed.Add(1)
			}
			j, buf := e.reserve(ret, len(out))
			copy(buf, out)
			rs := ret.Slot(j)
			rs.SetFn(w.fn)
			rs.SetCall(w.id, w.gen)
			rs.SetFlags(uint32(o))
			ret.Publish(j)
			if e.Drain != nil {
				e.Drain()
			} else {
				done.Signal(e.Done)
			}
		}
	}
}

// reserve waits for a return slot and room for n bytes. The host drains results
// independently of requests, so waiting here cannot deadlock.
func (e *Executor) reserve(p *fastpath.Producer, n int) (int, []byte) {
	for {
		if i, ok := p.Reserve(); ok {
			buf, err := p.Put(i, n)
			if err == nil {
				return i, buf
			}
			p.Release(i)
		}
		if e.Drain != nil {
			e.Drain()
		} else {
			e.Region.Returns().Completion().Signal(e.Done)
		}
		runtime.Gosched()
	}
}
