package knit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/lifecycle"
)

// defaultLogger logs warnings, and lane output, to stderr.
func defaultLogger() *zap.Logger {
	enc := zap.NewDevelopmentEncoderConfig()
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(os.Stderr), zapcore.InfoLevel)
	return zap.New(core).Named("knit")
}

// Pool runs tasks on lanes. Make one with NewPool; it is safe for concurrent use.
type Pool struct {
	cfg     Config
	log     *zap.Logger
	id      uint64
	epoch   time.Time
	lanes   []*lane
	defs    []actors.Def // the pool's tasks
	byIndex []actors.Def // registry index → task, nil for tasks not in the pool
	rr      atomic.Uint32

	futures  atomic.Int64 // unsettled futures: lanes' reapers must drain for them
	closing  atomic.Bool
	inflight atomic.Int64
	drained  chan struct{} // closed when closing and nothing is in flight
	drainMu  sync.Once

	closeOnce sync.Once
	closeDone chan struct{}
	closeErr  error
}

var poolIDs atomic.Uint64

// Definition is a task that NewPool accepts: a *Task of any type.
type Definition interface{ actorsDef() actors.Def }

// NewPool starts a pool serving tasks.
func NewPool(cfg Config, tasks ...Definition) (*Pool, error) {
	if lifecycle.IsLane() {
		return nil, &Error{Code: CodePoolUnavailable, Lane: -1,
			Message: "NewPool called inside a knit lane process: lanes never start pools (call knit.Main first in main)"}
	}
	if len(tasks) == 0 {
		return nil, &Error{Code: CodePoolUnavailable, Lane: -1, Message: "NewPool needs at least one task"}
	}
	cfg = cfg.withDefaults()
	p := &Pool{cfg: cfg, id: poolIDs.Add(1), epoch: time.Now(), log: cfg.Logger,
		drained: make(chan struct{}), closeDone: make(chan struct{})}
	if p.log == nil {
		p.log = defaultLogger()
	}
	all := actors.All()
	p.byIndex = make([]actors.Def, len(all))
	for _, t := range tasks {
		d := t.actorsDef()
		if p.byIndex[d.Index()] == nil {
			p.byIndex[d.Index()] = d
			p.defs = append(p.defs, d)
		}
	}
	for i := range cfg.Lanes {
		p.lanes = append(p.lanes, newLane(p, i))
	}
	var failed error
	for _, l := range p.lanes {
		if failed = l.start(); failed != nil {
			break
		}
	}
	if failed == nil && cfg.Runtime == Process {
		for _, l := range p.lanes {
			if l.proc != nil {
				if failed = l.awaitReady(); failed != nil {
					break
				}
			}
		}
	}
	if failed != nil {
		_ = p.Close(context.Background())
		return nil, failed
	}
	p.log.Debug("pool started", zap.Int("lanes", len(p.lanes)), zap.Stringer("runtime", cfg.Runtime))
	return p, nil
}

// pick chooses a ready lane for a call.
func (p *Pool) pick() *lane {
	n := len(p.lanes)
	switch p.cfg.Balancer {
	case FirstIdle, FirstIdleOrRandom:
		for _, l := range p.lanes {
			if l.inflight.Load() == 0 && l.state.Load() == laneReady {
				return l
			}
		}
	}
	start := 0
	if p.cfg.Balancer == Random || p.cfg.Balancer == FirstIdleOrRandom {
		start = rand.N(n)
	} else {
		start = int(p.rr.Add(1)) % n
	}
	for k := range n {
		if l := p.lanes[(start+k)%n]; l.state.Load() == laneReady {
			return l
		}
	}
	return nil
}

// dispatch hands a call to a lane and returns the lane it went to.
func (p *Pool) dispatch(ctx context.Context, c call) (*lane, error) {
	for {
		if p.closing.Load() {
			return nil, errClosed
		}
		l := p.pick()
		if l == nil {
			return nil, &Error{Code: CodePoolUnavailable, Lane: -1, Task: c.def.Name(), Message: "no live lane"}
		}
		_, err := l.submit(c)
		if err == nil {
			return l, nil
		}
		full, isFull := err.(*backlogFull)
		switch {
		case err == errLaneGone:
			continue
		case isFull && p.cfg.BlockWhenFull:
			select {
			case <-full.space:
				continue
			case <-ctx.Done():
				return nil, ctxError(ctx, c.def)
			}
		default:
			return nil, &Error{Code: CodeOverloaded, Lane: l.idx, Task: c.def.Name(),
				Message: fmt.Sprintf("lane backlog of %d calls is full", p.cfg.Backlog)}
		}
	}
}

var errClosed = &Error{Code: CodePoolClosed, Lane: -1, Message: "pool is closed"}

// ctxError is the error of a call whose caller's context ended.
func ctxError(ctx context.Context, d actors.Def) error {
	err := ctx.Err()
	code := CodeCanceled
	if errors.Is(err, context.DeadlineExceeded) {
		code = CodeTimeout
	}
	return &Error{Code: code, Lane: -1, Task: d.Name(), Cause: err}
}

// callDone accounts for a settled call; while closing, the last one opens Close's drain wait.
func (p *Pool) callDone() {
	if p.inflight.Add(-1) == 0 && p.closing.Load() {
		p.drainMu.Do(func() { close(p.drained) })
	}
}

func (p *Pool) wakeReapers() {
	for _, l := range p.lanes {
		l.wakeReaper()
	}
}

// Close stops taking calls (they fail with ErrPoolClosed), lets calls in flight finish
// within ctx, then stops the lanes in reverse start order. Calls still held when ctx ends
// or when a lane is stopped settle with THREAD_CLOSED. Close is idempotent and safe to call
// from many goroutines; every call returns the same error, which names lanes that did not
// acknowledge their stop request.
func (p *Pool) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		defer close(p.closeDone)
		p.closing.Store(true)
		p.wakeReapers()
		if p.inflight.Load() == 0 {
			p.drainMu.Do(func() { close(p.drained) })
		}
		select {
		case <-p.drained:
		case <-ctx.Done():
		}
		var abandoned []string
		for i := len(p.lanes) - 1; i >= 0; i-- {
			if !p.lanes[i].stop() {
				abandoned = append(abandoned, fmt.Sprint(i))
			}
		}
		for _, l := range p.lanes {
			if !l.started {
				continue
			}
			l.wakeReaper()
			<-l.reaped
			if l.proc != nil {
				<-l.proc.gone
			}
		}
		if len(abandoned) > 0 {
			what := "abandoned"
			if p.cfg.Runtime == Process {
				what = "killed"
			}
			p.closeErr = &Error{Code: CodeThreadClosed, Lane: -1,
				Message: "lanes did not acknowledge their stop request and were " + what + ": " + strings.Join(abandoned, ", ")}
		}
	})
	<-p.closeDone
	return p.closeErr
}

// stop asks the lane to stop and waits StopAckTimeout for it to end. A process lane that
// does not end in time gets SIGTERM, then SIGKILL after KillGrace; a goroutine lane is
// abandoned: its rings are fenced and its calls settled. It reports whether the lane ended
// by itself.
func (l *lane) stop() bool {
	l.mu.Lock()
	if l.state.Load() == laneEnded || !l.started {
		l.state.Store(laneEnded)
		l.mu.Unlock()
		return true
	}
	l.state.Store(laneStopping)
	l.region.Stop().Store(fastpath.StopRequested)
	l.wake.Force(l.laneBell)
	l.mu.Unlock()
	cfg := l.p.cfg
	acked := waitFor(cfg.StopAckTimeout, l.ended, l.acked)
	switch {
	case l.proc == nil && !acked:
		l.close(&Error{Code: CodeThreadClosed, Lane: l.idx, Message: "lane did not acknowledge its stop request; abandoned"}, false)
	case l.proc != nil && !acked:
		_ = syscall.Kill(-l.proc.pid, syscall.SIGTERM)
		if !waitFor(cfg.KillGrace, l.ended) {
			_ = syscall.Kill(-l.proc.pid, syscall.SIGKILL)
		}
	case l.proc != nil:
		// Acknowledged: the process is on its way out. One that never gets there is
		// still reaped.
		if !waitFor(cfg.KillGrace, l.ended) {
			_ = syscall.Kill(-l.proc.pid, syscall.SIGKILL)
		}
	}
	<-l.ended
	return acked
}

// waitFor reports whether one of cs closed within d.
func waitFor(d time.Duration, cs ...<-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for len(cs) < 2 {
		cs = append(cs, nil)
	}
	select {
	case <-cs[0]:
		return true
	case <-cs[1]:
		return true
	case <-t.C:
		return false
	}
}

// LaneStats describes one lane.
type LaneStats struct {
	Lane      int
	State     string
	InFlight  int // calls on the lane, including its backlog
	Queued    int // calls in its backlog
	Completed uint64
	Failed    uint64
	PID       int // the lane's process (process lanes)
}

func (l *lane) pid() int {
	if l.proc == nil {
		return 0
	}
	return l.proc.pid
}

// Stats describes a pool.
type Stats struct {
	Runtime Runtime
	Lanes   []LaneStats
	Closed  bool
}

// Stats returns a snapshot of the pool's lanes.
func (p *Pool) Stats() Stats {
	s := Stats{Runtime: p.cfg.Runtime, Closed: p.closing.Load()}
	for _, l := range p.lanes {
		state := "ready"
		var st fastpath.StatsSnapshot
		l.mu.Lock()
		endErr := l.endErr
		switch {
		case l.unmapped:
			st = l.proc.final
		case l.region != nil:
			st = l.region.Stats().Snapshot()
		}
		l.mu.Unlock()
		switch l.state.Load() {
		case laneStopping:
			state = "stopping"
		case laneEnded:
			state = "closed"
			if endErr != nil && endErr.Code != CodeThreadClosed {
				state = strings.ToLower(string(endErr.Code))
			}
		}
		s.Lanes = append(s.Lanes, LaneStats{Lane: l.idx, State: state, InFlight: int(l.inflight.Load()),
			Queued: int(l.queued.Load()), Completed: st.Completed, Failed: st.Failed, PID: l.pid()})
	}
	return s
}
