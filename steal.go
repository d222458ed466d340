package knit

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/logging"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/steal"
)

// sharedKey names the pool's shared submit ring in call records, in place of a lane key:
// a call published there belongs to no lane until one claims it, and the host learns which
// from the result (or, after a death, from the claim journal).
const sharedKey int32 = -3

// sharedAbortBase offsets the abort bits of calls on the shared ring, in slot headers and
// records, from those of a lane's own ring: the lane looks them up in the pool-wide bitmap.
const sharedAbortBase = lifecycle.SharedAbortBase

// shared is the host side of a stealing pool's submit ring: its host end (host: the
// producer under mu, shared by every caller, its backlog and the pool-wide abort bits of
// its calls), the lanes' consumer ids, and recovery of what a dead lane had claimed. Each
// lane answers the calls it claims on its own return ring.
type shared struct {
	p    *Pool
	mode Steal
	ring *steal.Ring
	mem  []byte       // the mapping: heap for goroutine lanes, mp's for process lanes
	mp   *shm.Mapping // process lanes: the sealed memfd every lane maps

	mu   sync.Mutex
	prod *steal.Producer // under mu
	host *actors.HostRing

	inflight atomic.Int32 // calls on the ring or its backlog, or claimed and unsettled
	always   atomic.Bool  // every call goes through the ring, even to an idle lane (tests)
	waiters  atomic.Int32 // callers blocked on a shared call's result: every reaper must run
	unmap    sync.Once

	ids   []int                                    // under mu: free consumer ids
	owner [steal.MaxConsumers]atomic.Pointer[lane] // the lane incarnation each id is
}

// ticketWidth is the most calls one Ticket claim takes (Half still limits it to half of what
// waits, rounded up). The Dekker region formula gave 4 lanes batches of 4 and 8 lanes batches
// of 1, and a lane then claimed far more often than a private lane takes its ring: with 1024
// futures in flight over 8 process lanes, Ticket moved 0.83× the calls of private lanes, and
// 0.96× with 8 (4 lanes: 0.99× and 1.04×); 1024 goroutines calling over 8 lanes pay for it
// (0.93× to 0.86×). 8 is the widest the model check covers (BenchmarkTicketWidth;
// docs/benchmarks.md, "A lost wake, the idle meter, and Ticket's batch").
const ticketWidth = 8

// autoSteals says, by runtime, whether StealAuto steals (in pools of 2 to 31 lanes with the
// default balancer and no sandbox): goroutine lanes with StealLocal, process lanes with
// StealTicket (docs/stealing.md, "The default").
var autoSteals = [...]bool{Goroutine: true, Process: false, Remote: false}

// stealMode is the discipline a pool of cfg steals with, or StealOff and why not.
func stealMode(cfg Config, caps lifecycle.Caps) (Steal, string) {
	m := cfg.Steal
	switch {
	case m == StealOff, m == StealAuto && !autoSteals[cfg.Runtime]:
		return StealOff, ""
	case m == StealLocal:
		return StealLocal, "" // no ring: any number of lanes
	case cfg.Lanes > steal.MaxConsumers:
		return StealOff, fmt.Sprintf("%d lanes: at most %d share a submit ring", cfg.Lanes, steal.MaxConsumers)
	case m != StealAuto:
		return m, ""
	case cfg.Lanes < 2:
		return StealOff, "one lane"
	case cfg.Balancer != LeastLoaded:
		return StealOff, "a Balancer is set"
	case caps.Confined && laneSandbox(cfg) != nil:
		return StealOff, "lanes are sandboxed: untrusted code shares no mapping with other lanes"
	case caps.LocalSteal:
		return StealLocal, ""
	}
	return StealTicket, ""
}

// checkSteal refuses what an explicit discipline cannot do.
func checkSteal(cfg Config, caps lifecycle.Caps) error {
	switch {
	case cfg.Steal == StealLocal && !caps.LocalSteal:
		return &Error{Code: CodeInvalidArgument, Lane: -1,
			Message: "StealLocal is for goroutine lanes (process lanes share a submit ring: StealTicket or StealDekker)"}
	case (cfg.Steal == StealTicket || cfg.Steal == StealDekker) && caps.Networked:
		return &Error{Code: CodeInvalidArgument, Lane: -1,
			Message: "work stealing shares a submit ring in memory: remote lanes have none (StealOff)"}
	case cfg.Steal == StealDekker && (cfg.MaxCallsPerLane > 0 || cfg.Process.MaxLaneMemory > 0):
		return &Error{Code: CodeInvalidArgument, Lane: -1,
			Message: "StealDekker does not recycle lanes (its regions are sized for the lanes it starts with): use StealTicket"}
	}
	return nil
}

// newShared builds the shared submit ring of a stealing pool (nil, nil: the pool uses
// private lanes).
func newShared(p *Pool) (*shared, error) {
	cfg := p.cfg
	mode, why := stealMode(cfg, p.caps)
	if mode == StealOff || mode == StealLocal {
		// Asked for, or a pool too large for it: say why not. (A balancer, one lane or a
		// sandbox chose private lanes on purpose.)
		if why != "" && (cfg.Steal >= StealTicket || cfg.Lanes > steal.MaxConsumers) {
			p.root.Named(logging.Steal).Info("work stealing off: private lanes", zap.String("reason", why))
		}
		return nil, nil
	}
	// Ticket takes every consumer id the ring can have, so that lanes added by Resize and
	// a recycled lane's successor (which serves beside it) get ids of their own; its batch
	// width is ticketWidth whatever the lanes. Dekker's regions are sized for its
	// consumers: a Dekker pool neither grows nor recycles.
	width := ticketWidth
	if w := cfg.test.ticketWidth; w > 0 {
		width = w
	}
	sc := steal.Config{Consumers: steal.MaxConsumers, Width: width, Half: true,
		Discipline: steal.Ticket, Inline: cfg.Payload.Inline, Arena: 64}
	if mode == StealDekker {
		sc.Discipline, sc.Consumers, sc.Width = steal.Dekker, cfg.Lanes, 0 // Half stays
	}
	bits := 0
	if p.caps.Remote {
		sc.Arena, bits = cfg.Payload.Arena, fastpath.DefaultAbortBits
	}
	size, err := steal.MappingSize(sc, bits)
	if err != nil {
		return nil, err
	}
	s := &shared{p: p, mode: mode}
	if p.caps.Remote {
		if s.mp, err = shm.CreateMemfd("knit-steal", size); err != nil {
			return nil, &Error{Code: CodeStartupFailed, Lane: -1, Message: fmt.Sprintf("shared submit ring: %v", err)}
		}
		s.mem = s.mp.Bytes()
	} else {
		s.mem = shm.Heap(size)
	}
	var aborts fastpath.Bitmap // process lanes: the abort bits of calls on the ring
	if s.ring, err = steal.New(s.mem, sc); err == nil && bits > 0 {
		aborts, err = s.ring.Aborts(s.mem, bits)
	}
	if err != nil {
		s.release()
		return nil, err
	}
	s.prod = s.ring.Producer(p.root)
	s.host = actors.NewHostRing(actors.RingConfig{Mu: &s.mu, Owner: s, Submit: s.prod, Key: sharedKey,
		Backlog: cfg.Backlog, BlockWhenFull: cfg.BlockWhenFull, Aborts: aborts, AbortBase: sharedAbortBase})
	for c := sc.Consumers - 1; c >= 0; c-- {
		s.ids = append(s.ids, c)
	}
	if ce := logging.Debug(p.root.Named(logging.Steal), "shared submit ring"); ce != nil {
		ce.Write(zap.Stringer("discipline", mode), zap.Int("consumers", sc.Consumers),
			zap.Int("width", s.ring.Config().Width), zap.Int("bytes", size))
	}
	return s, nil
}

// release unmaps a process pool's shared mapping, once every lane is gone.
func (s *shared) release() {
	if s.mp != nil {
		s.unmap.Do(func() { _ = s.mp.Close() })
	}
}

// join gives a starting lane incarnation a consumer id of its own (-1: none is free, and
// the lane does not claim: Resize refuses more lanes than ids).
func (s *shared) join(l *lane) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.ids)
	if n == 0 {
		return -1
	}
	c := s.ids[n-1]
	s.ids = s.ids[:n-1]
	s.prod.Activate(c) // its last holder, if any, was recovered before the id came back
	s.owner[c].Store(l)
	return c
}

// leave gives back the id of a lane incarnation that never started: it claimed nothing.
func (s *shared) leave(l *lane) {
	if l.cid < 0 {
		return
	}
	s.mu.Lock()
	s.owner[l.cid].Store(nil)
	s.ids = append(s.ids, l.cid)
	s.mu.Unlock()
	l.cid = -1
}

// submit publishes c on the ring, or queues it in the backlog.
func (s *shared) submit(c actors.Call) error {
	// Count the call before looking at closing, as Close sets closing before it looks at
	// what is in flight: either Close waits for this call, or the call sees Close and
	// goes no further (else it could be published after the lanes stopped claiming).
	s.inflight.Add(1)
	if _, err := s.host.Submit(&c); err != nil {
		s.inflight.Add(-1)
		s.p.callDone()
		return err
	}
	return nil
}

// Admit implements actors.RingOwner: nothing is published once the pool has stopped its
// lanes or is closing.
func (s *shared) Admit() error {
	if s.host.Closed() || s.p.closing.Load() {
		return errClosed
	}
	return nil
}

// Accept implements actors.RingOwner: submit has counted the call.
func (s *shared) Accept() {}

// Published implements actors.RingOwner.
func (s *shared) Published() { s.wake() }

// Dropped implements actors.RingOwner: calls whose callers had gone left the backlog.
func (s *shared) Dropped(n int) {
	for range n {
		s.settled()
	}
	s.p.callDone()
}

// flush moves backlog calls into slots the lanes have freed.
func (s *shared) flush() { s.host.Flush() }

// wake makes sure enough lanes will claim what waits on the ring: a lane awake and looking
// for work counts, and so does one that was rung and has not run yet; parked lanes are rung,
// lowest first, until there are as many as calls waiting (so that, as with LeastLoaded,
// lane 0 takes calls one at a time while the others stay parked). A busy lane claims again
// once its calls are done.
func (s *shared) wake() {
	p := s.p
	want := max(s.prod.Waiting(), 1)
	for i := range p.laneCount() {
		if l := p.slots[i].cur.Load(); l != nil && l.cid >= 0 && l.State() == lifecycle.LaneReady && l.offer() {
			if want--; want == 0 {
				return
			}
		}
	}
}

// offer reports whether lane l will claim a call just published: it is awake, or was
// parked and this rang it, and its running word says it is not busy. A process lane's
// region is read under its mu, which guards it against unmapping.
//
// The running word is read last, after the publication and after the awake word: a lane
// stores busy before it claims and idle again only after its batch ends or when its claim
// took nothing (and then it looks at the ring again), so a lane read idle here still has
// to load the ring after this call was published. A lane read busy may be one that has
// claimed and not started yet: it claims nothing more until its batch ends, however long
// that takes, so it is not counted, even when this rang it (issue 13: a lane counted
// between its claim of a call that never ended and that call's start left another call
// waiting while the other lane stayed parked).
func (l *lane) offer() bool {
	if l.reaper {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.Unmapped() {
			return false
		}
	}
	if awake, _ := l.wake.Awake(); !awake && !l.wake.Ring(l.laneBell) {
		return false
	}
	return !fastpath.Busy(l.Region().Running().Load())
}

// needReaper and doneWaiting: a caller blocked on a shared call's result needs every
// reaper of a process pool to run, as it cannot know which lane will answer.
func (s *shared) needReaper() {
	if s.p.reaped && s.waiters.Add(1) == 1 {
		s.p.kickReapers()
	}
}

func (s *shared) drained() bool { return s.p.reaped }

func (s *shared) crowded() {
	if s.p.reaped && s.inflight.Load() > fastpath.Slots {
		s.p.kickReapers()
	}
}

func (s *shared) doneWaiting() {
	if s.p.reaped {
		s.waiters.Add(-1)
	}
}

// settled follows a result of a shared call: one call fewer in flight (never below zero: a
// call failed after a corrupt journal may still be answered).
func (s *shared) settled() {
	for {
		n := s.inflight.Load()
		if n <= 0 || s.inflight.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// raiseAbort sets a shared call's abort bit (offset by sharedAbortBase) if it still belongs
// to the call.
func (s *shared) raiseAbort(bit int32, fn, id uint32) {
	s.mu.Lock()
	s.host.RaiseAbortLocked(bit, fn, id)
	s.mu.Unlock()
}

// AbortRaised implements actors.RingOwner: it pokes every lane's abort watcher, as any of
// them may run the call.
func (s *shared) AbortRaised() {
	p := s.p
	for i := range p.laneCount() {
		if l := p.slots[i].cur.Load(); l != nil {
			l.pokeAborts()
		}
	}
}

// holder is the lane running the shared call published as seq, as its journal says (nil:
// none says so).
func (s *shared) holder(seq uint64) *lane {
	s.mu.Lock()
	c, ok := s.prod.Holder(seq)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	return s.owner[c].Load()
}

// recover settles exactly the shared calls lane l held when it died, from its claim
// journal: those it had claimed and provably not started run again; those it had started
// run again if Idempotent (once), else fail with e, as on a private lane. release is false
// for an abandoned goroutine lane, which may still run: its calls all fail and their
// records are never reused. A journal that breaks the protocol (a lane scribbled over the
// mapping) leaves unknown which calls it held: every call on the ring then fails, and a
// result that still comes for one settles nothing.
func (s *shared) recover(l *lane, e *Error, release bool) {
	if l.cid < 0 {
		return
	}
	s.mu.Lock()
	rec, err := s.prod.Recover(l.cid)
	s.owner[l.cid].Store(nil)
	if release { // an abandoned goroutine keeps its id: it might still write its journal
		s.ids = append(s.ids, l.cid)
	}
	s.mu.Unlock()
	held := func(seq uint64, abort int32) (bool, bool) {
		i := slices.IndexFunc(rec.Fresh, func(c steal.Call) bool { return c.Seq == seq })
		j := slices.IndexFunc(rec.Started, func(c steal.Call) bool { return c.Seq == seq })
		if i < 0 && j < 0 {
			return false, false
		}
		if abort >= sharedAbortBase { // the call gives its bit back: it gets a new one if it runs again
			s.host.ReleaseAbort(abort)
		}
		return true, j >= 0
	}
	end := actors.LaneEnd{Owner: s.p.id, Lane: sharedKey, Release: release, Requeue: s.p.requeue, Shared: held,
		Err: laneEndError(l, e)}
	if err != nil {
		ce := *e
		ce.Message = "the shared submit ring's claim journal of lane " + fmt.Sprint(l.Idx) + " is corrupt"
		ce.Cause = err
		end.Err = laneEndError(l, &ce)
		end.Keep, end.Requeue = true, nil
		end.Shared = func(seq uint64, _ int32) (bool, bool) { return seq != 0, true }
	}
	n := 0
	for _, d := range s.p.defs {
		n += d.FailLane(end)
	}
	for range n {
		s.settled()
	}
	if n > 0 || rec.Retired != 0 || err != nil {
		l.DebugTo(s.p.root.Named(logging.Steal), "claim journal recovered", zap.Int("fresh", len(rec.Fresh)),
			zap.Int("started", len(rec.Started)), zap.Int("calls_settled", n), zap.Error(err))
	}
	if s.host.Queued() > 0 { // recovery retired the slots the lane held
		s.flush()
	}
	s.leaving()
	s.p.callDone()
}

// leaving follows a lane that stopped claiming (retiring: its open word is cleared; dead:
// recovered): a call published just before may have counted on it, so the lanes left are
// woken for what still waits. (Its state, stored before, keeps wake from counting it.)
func (s *shared) leaving() {
	if s.prod.Waiting() > 0 { // reads shared words only: safe beside the producer
		s.wake()
	}
}

// close fails every call still on the ring or its backlog once the pool has stopped its
// lanes (or given them all up): no lane will claim them.
func (s *shared) close(e *Error) {
	s.mu.Lock()
	if s.host.Closed() {
		s.mu.Unlock()
		return
	}
	s.host.CloseLocked() // the backlog's calls name the ring in their records: they fail below
	s.mu.Unlock()
	end := actors.LaneEnd{Owner: s.p.id, Lane: sharedKey, Release: true,
		Shared: func(uint64, int32) (bool, bool) { return true, false },
		Err:    func(bool, bool) error { return e }}
	n := 0
	for _, d := range s.p.defs {
		n += d.FailLane(end)
	}
	for range n {
		s.settled()
	}
	s.p.callDone()
}

// laneEndError is how a call a lane held fails when the lane ends with e.
func laneEndError(l *lane, e *Error) func(started, poison bool) error {
	return func(started, poison bool) error {
		if poison {
			return &Error{Code: CodePoisonCall, Lane: l.Idx, Started: true,
				Message: "the call was running on two lanes that died: it is not run again", Cause: e}
		}
		ce := *e
		ce.Started = started
		return &ce
	}
}

// pokeAborts wakes a process lane's abort watcher to look at the shared abort bits.
func (l *lane) pokeAborts() {
	if !l.reaper {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.Unmapped() {
		l.AbortRaised()
	}
}

// checkResize refuses a size a stealing pool cannot take.
func (s *shared) checkResize(n int) error {
	switch {
	case s.mode == StealDekker:
		return &Error{Code: CodeInvalidArgument, Lane: -1,
			Message: "a StealDekker pool cannot be resized (its regions are sized for the lanes it starts with)"}
	case n > steal.MaxConsumers:
		return &Error{Code: CodeInvalidArgument, Lane: -1,
			Message: fmt.Sprintf("%d lanes: a stealing pool has at most %d (Config.Steal: StealOff for more)", n, steal.MaxConsumers)}
	}
	return nil
}
