package knit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/supervisor"
)

// maxLanes bounds a pool's lanes, Resize included. The lane table is allocated at this size
// once, so that the call path reads it without a lock and Resize never moves it: a lane
// slot is two atomic pointers (16 KiB per pool).
const maxLanes = 1024

// keyIncs is how many incarnations of a lane have distinct record keys; keys wrap after
// that, long after any call of an incarnation that far back has settled.
const keyIncs = (1 << 31) / maxLanes

// laneKey names incarnation inc of lane idx in call records: unique among the incarnations
// that can hold calls at once, whatever the number of lanes (which Resize changes).
func laneKey(idx, inc int) int32 { return int32((inc%keyIncs)*maxLanes + idx) }

// laneSlot is one lane of the pool.
type laneSlot struct {
	cur atomic.Pointer[lane] // the incarnation taking calls (or the last one, while it restarts)
	old atomic.Pointer[lane] // a recycled incarnation finishing its calls, nil when none
}

// lanes returns the slot's incarnations, current and finishing; either may be nil.
func (s *laneSlot) lanes() [2]*lane { return [2]*lane{s.cur.Load(), s.old.Load()} }

// laneCount is how many lanes the pool has: slots [0, laneCount) are in use. Retiring lanes
// count until they have stopped; a slot whose lane is booting for the first time is nil.
func (p *Pool) laneCount() int { return int(p.size.Load()) }

// Resize sets the number of lanes to n (1 to 1024), without a restart and without losing a
// call.
//
// Growing adds lanes n-1, n-2 … after the others: they boot the way restarts do (a process
// lane takes a spare first), under the pool's supervision from their first boot, and take
// calls as soon as each is ready. Resize returns once all are ready.
//
// Shrinking retires the highest lanes: each stops taking new calls at once (the balancer
// skips it), finishes the calls it holds — those in its backlog included — and then goes
// through the stop protocol; Resize returns once every one has stopped and left the pool.
// No call is lost and none runs twice.
//
// ctx bounds the wait. When it ends, lanes being added keep booting (and are restarted if
// they fail, like any lane), and lanes being removed are stopped at once: the stop protocol,
// where calls that had not started run on another lane. Resize then returns a TIMEOUT or
// CANCELED *Error; the pool has the new number of lanes either way. Resize calls run one at a
// time; Close may run at any moment (it stops every lane, retiring ones included), and a
// Resize after Close began fails with POOL_CLOSED. Supervision strategies act on the lanes the
// pool has: RestForOne takes added lanes along with any lane below them (lane order is start
// order), and a retiring lane is part of no restart group.
func (p *Pool) Resize(ctx context.Context, n int) error {
	switch {
	case p == nil:
		return &Error{Code: CodeInvalidArgument, Lane: -1, Message: "nil pool"}
	case n < 1 || n > maxLanes:
		return &Error{Code: CodeInvalidArgument, Lane: -1, Message: fmt.Sprintf("cannot resize to %d lanes (1 to %d)", n, maxLanes)}
	case ctx == nil:
		return &Error{Code: CodeInvalidArgument, Lane: -1, Message: "nil context"}
	case p.tree == nil:
		return &Error{Code: CodeInvalidArgument, Lane: -1, Message: "an unsupervised pool cannot be resized"}
	}
	p.resizeMu.Lock()
	defer p.resizeMu.Unlock()
	if p.closing.Load() {
		return &Error{Code: CodePoolClosed, Lane: -1, Message: "pool is closed: cannot resize"}
	}
	cur := p.laneCount()
	if n == cur {
		return nil
	}
	if p.shared != nil {
		if err := p.shared.checkResize(n); err != nil {
			return err
		}
	}
	p.log.Info("resizing the pool", zap.Int("from", cur), zap.Int("to", n))
	var err error
	if n > cur {
		err = p.grow(ctx, cur, n)
	} else {
		err = p.shrink(ctx, cur, n)
	}
	if err != nil {
		p.log.Warn("resizing the pool", zap.Int("from", cur), zap.Int("to", n), zap.Error(err))
		return err
	}
	p.log.Info("pool resized", zap.Int("lanes", n))
	return nil
}

// grow adds lanes [cur, n) and waits for them to be ready.
func (p *Pool) grow(ctx context.Context, cur, n int) error {
	p.size.Store(int32(n)) // the new slots stay nil, and are skipped, until their lanes open
	if err := p.tree.Resize(n, nil); err != nil {
		return p.resizeError(err)
	}
	// Ready by the lane's life and by the supervisor's account, which Stats reports (it
	// records the lane ready just after the lane is, and signals then: host.Event).
	ready := func() bool {
		for i := cur; i < n; i++ {
			if l := p.slots[i].cur.Load(); l == nil || l.State() != lifecycle.LaneReady {
				return false
			}
			if st, _, _ := p.tree.LaneState(i); st != supervisor.Ready {
				return false
			}
		}
		return true
	}
	for {
		changed := p.changes()
		switch {
		case ready():
			return nil
		case p.closing.Load():
			return &Error{Code: CodePoolClosed, Lane: -1, Message: "pool closed while lanes were being added"}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return &Error{Code: ctxCode(ctx), Lane: -1, Message: fmt.Sprintf("lanes added, not all ready yet (%d lanes)", n), Cause: ctx.Err()}
		}
	}
}

// shrink retires lanes [n, cur): the supervisor has each finish its calls and stop; then
// their slots are cleared, once any recycled incarnation in them has retired too.
func (p *Pool) shrink(ctx context.Context, cur, n int) error {
	if err := p.tree.Resize(n, ctx.Done()); err != nil {
		return p.resizeError(err)
	}
	done := ctx.Done()
	for {
		changed := p.changes()
		var busy []*lane
		for i := n; i < cur; i++ {
			if o := p.slots[i].old.Load(); o != nil {
				busy = append(busy, o)
			}
		}
		if len(busy) == 0 {
			break
		}
		select {
		case <-changed: // a recycled incarnation that has retired signals; Close hurries it
		case <-done: // stop at once, like the lanes retired above
			for _, o := range busy {
				o.Stop()
			}
			done = nil
		}
	}
	p.size.Store(int32(n))
	for i := n; i < cur; i++ {
		p.slots[i].cur.Store(nil)
	}
	if ctx.Err() != nil {
		return &Error{Code: ctxCode(ctx), Lane: -1, Message: fmt.Sprintf("resized to %d lanes; the retiring lanes were stopped before their calls finished", n), Cause: ctx.Err()}
	}
	return nil
}

func (p *Pool) resizeError(err error) error {
	if errors.Is(err, supervisor.ErrClosed) {
		return &Error{Code: CodePoolClosed, Lane: -1, Message: "pool is closed: cannot resize", Cause: err}
	}
	return &Error{Code: CodePoolUnavailable, Lane: -1, Message: "resize", Cause: errorOf(err)}
}

func ctxCode(ctx context.Context) Code {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return CodeTimeout
	}
	return CodeCanceled
}
