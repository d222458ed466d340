package knit

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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

	// Grants (process lanes, steal.Producer.RequireGrants): a lane runs nothing it claimed
	// until the host has granted it, and the host grants each call once, forwarding it
	// whole to the claimant's own ring (grant). board is the call staged in each slot (under
	// mu); books the calls granted to each consumer id and not settled; degraded is set
	// once the host has given the ring up (degrade): calls then go to the lanes' own rings.
	grants bool
	board  [steal.Slots]actors.Call
	// expired is, per slot, the call the audit took back from a claimant that had not sent
	// its notice in time (expire; under mu): that claimant's late notice is refused
	// without giving the ring up.
	expired  [steal.Slots]uint64
	books    [steal.MaxConsumers]book
	degraded atomic.Bool
	whyGone  atomic.Pointer[string] // why the ring was given up, for diagnostics
	closed   bool                   // under mu: close has run
	// The audit (process lanes): a goroutine that checks the mapping against the host's
	// record every auditEvery, and gives the ring up when it is broken or stuck.
	auditStop chan struct{}
	auditDone chan struct{}
	auditOnce sync.Once
}

// grantKey names a granted call by task and record (record ids are per task).
type grantKey struct{ fn, id uint32 }

// granted is a call granted to a lane: its record's generation, its sequence number on the
// shared ring, its sequence number on the lane's own ring (own; 0 until forwarded) and its
// abort bit.
type granted struct {
	gen   uint32
	abort int32
	seq   uint64
	own   uint64
}

// book is what the host granted one consumer id and has not seen settled.
type book struct {
	mu    sync.Mutex
	calls map[grantKey]granted
}

func (b *book) add(k grantKey, g granted) {
	b.mu.Lock()
	if b.calls == nil {
		b.calls = map[grantKey]granted{}
	}
	b.calls[k] = g
	b.mu.Unlock()
}

func (b *book) setOwn(k grantKey, own uint64) {
	b.mu.Lock()
	if g, ok := b.calls[k]; ok {
		g.own = own
		b.calls[k] = g
	}
	b.mu.Unlock()
}

// take removes k if the book holds it with that generation and abort field (the bit + 1 as
// a slot carries it, 0 for none).
func (b *book) take(k grantKey, gen, abort uint32) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	g, ok := b.calls[k]
	if !ok || g.gen != gen || abort != uint32(g.abort+1) {
		return false
	}
	delete(b.calls, k)
	return true
}

func (b *book) remove(k grantKey) {
	b.mu.Lock()
	delete(b.calls, k)
	b.mu.Unlock()
}

// drain empties the book and returns what it held, by shared sequence number.
func (b *book) drain() map[uint64]granted {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[uint64]granted, len(b.calls))
	for _, g := range b.calls {
		out[g.seq] = g
	}
	clear(b.calls)
	return out
}

// The audit's pace: every auditEvery the host checks the mapping against its record. A call
// the ring has held claimed with no notice for stuckAfter is taken back and dispatched again
// (once per expireAgain; twice, and the ring is given up); one claimable while a lane has
// been free to claim for half that means the ring no longer works.
const (
	auditEvery = 100 * time.Millisecond
	stuckAfter = time.Second
	// expireAgain: a second call claimed and not handed over within this of the first
	// (expire) gives the ring up.
	expireAgain = 10 * stuckAfter
)

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
	// Process lanes map the ring writable, each in a process of its own: what one writes
	// there must not make another run a call twice, so their claims are granted by the host
	// (goroutine lanes share the host's memory anyway).
	s.grants = p.caps.Remote
	if s.grants {
		s.prod.RequireGrants()
	}
	s.host = actors.NewHostRing(actors.RingConfig{Mu: &s.mu, Owner: s, Submit: s.prod, Key: sharedKey,
		Backlog: cfg.Backlog, BlockWhenFull: cfg.BlockWhenFull, Aborts: aborts, AbortBase: sharedAbortBase,
		HeadersOnly: s.grants})
	for c := sc.Consumers - 1; c >= 0; c-- {
		s.ids = append(s.ids, c)
	}
	if s.grants {
		s.auditStop, s.auditDone = make(chan struct{}), make(chan struct{})
		go s.audit(s.auditStop, s.auditDone)
	}
	if ce := logging.Debug(p.root.Named(logging.Steal), "shared submit ring"); ce != nil {
		ce.Write(zap.Stringer("discipline", mode), zap.Int("consumers", sc.Consumers),
			zap.Int("width", s.ring.Config().Width), zap.Int("bytes", size))
	}
	return s, nil
}

// release unmaps a process pool's shared mapping, once every lane is gone.
func (s *shared) release() {
	s.stopAudit()
	if s.mp != nil {
		s.unmap.Do(func() {
			s.prod.Detach() // Stats may still ask what the lanes hold
			_ = s.mp.Close()
		})
	}
}

// stopAudit ends the audit goroutine and waits for it.
func (s *shared) stopAudit() {
	if s.auditStop == nil {
		return
	}
	s.auditOnce.Do(func() { close(s.auditStop) })
	<-s.auditDone
}

// join gives a starting lane incarnation a consumer id of its own (-1: none is free, and
// the lane does not claim: Resize refuses more lanes than ids).
func (s *shared) join(l *lane) int {
	if s.degraded.Load() {
		return -1 // the ring was given up: the lane serves its own ring only
	}
	if s.grants {
		// A lane validates the control block when it maps the ring: one rewritten would keep
		// every lane from starting, for good.
		if err := s.prod.CheckHeader(); err != nil {
			s.degrade(err.Error())
			return -1
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.ids)
	if n == 0 || s.degraded.Load() {
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

// submit publishes c on the ring, or queues it in the backlog; once the ring is given up,
// it submits it to a lane's own ring.
func (s *shared) submit(c actors.Call) error {
	if s.degraded.Load() {
		return s.submitPrivate(c)
	}
	// Count the call before looking at closing, as Close sets closing before it looks at
	// what is in flight: either Close waits for this call, or the call sees Close and
	// goes no further (else it could be published after the lanes stopped claiming).
	s.inflight.Add(1)
	if _, err := s.host.Submit(&c); err != nil {
		s.inflight.Add(-1)
		s.p.callDone()
		if err == errClosed && s.degraded.Load() && !s.p.closing.Load() {
			return s.submitPrivate(c) // given up meanwhile
		}
		return err
	}
	return nil
}

// submitPrivate gives c to the least loaded ready lane's own ring, as a pool with private
// lanes does (the ring was given up), waiting for a lane if none is ready.
func (s *shared) submitPrivate(c actors.Call) error {
	p := s.p
	for {
		if p.closing.Load() {
			return errClosed
		}
		changed := p.changes()
		if l := p.leastLoaded(nil); l != nil {
			if err := l.submit(c); err != errLaneGone {
				return err
			}
			continue
		}
		if e := p.failed.Load(); e != nil {
			return &Error{Code: e.Code, Lane: -1, Task: c.Def.Name(), Message: e.Message, Cause: e.Cause}
		}
		select {
		case <-changed:
		case <-c.Done:
			return &Error{Code: CodeCanceled, Lane: -1, Task: c.Def.Name(), Message: "the caller gave up while no lane was ready"}
		}
	}
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
func (s *shared) Accept(int) {}

// Published implements actors.RingOwner.
func (s *shared) Published() { s.wake() }

// Dropped implements actors.RingOwner: calls whose callers had gone left the backlog.
func (s *shared) Dropped(n int) {
	s.uncount(n)
	s.p.callDone()
}

// Staged implements actors.SharedOwner: under grants, the host forwards the call staged in
// a slot to the lane it grants it to.
func (s *shared) Staged(slot int, _ uint64, c actors.Call) {
	if s.grants {
		s.board[slot] = c
	}
}

// Answer implements actors.SharedOwner: a result for a call of the ring is uncounted before
// its caller wakes (Stats and Close read the count after the result), and under grants it
// must come from the lane the call was granted to, with the abort bit it was given.
func (s *shared) Answer(by actors.RingOwner, fn, id, gen, abort uint32) error {
	if s.grants {
		l, ok := by.(*lane)
		if !ok || l.cid < 0 || !s.books[l.cid].take(grantKey{fn, id}, gen, abort) {
			return fmt.Errorf("%w: a result for call %d/%d of task %d, which the host did not grant this lane",
				fastpath.ErrCorrupt, id, gen, fn)
		}
		s.prod.AddGranted(l.cid, -1)
	}
	s.uncount(1)
	return nil
}

// flush moves backlog calls into slots the lanes have freed.
func (s *shared) flush() { s.host.Flush() }

// wake makes sure enough lanes will claim what waits on the ring: a lane awake and looking
// for work counts, and so does one that was rung and has not run yet; parked lanes are rung,
// lowest first, until there are as many as calls waiting (so that, as with LeastLoaded,
// lane 0 takes calls one at a time while the others stay parked). A busy lane claims again
// once its calls are done.
func (s *shared) wake() {
	if s.degraded.Load() {
		return
	}
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

// settled follows a result of a shared call (lane.SettleResult): Answer has uncounted it
// already, before its caller woke.
func (s *shared) settled() {}

// uncount takes n calls off the count in flight (never below zero: a call failed after a
// corrupt journal may still be answered).
func (s *shared) uncount(n int) {
	for range n {
		for {
			k := s.inflight.Load()
			if k <= 0 || s.inflight.CompareAndSwap(k, k-1) {
				break
			}
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
// none says so). Under grants the host knows: the lane it granted the call to, if that
// lane's running word shows the call running.
func (s *shared) holder(seq uint64) *lane {
	if s.grants {
		return s.grantee(seq)
	}
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
	var revoked []uint64
	if s.grants { // the journal is a hint: the calls it names that the ring still holds
		for _, c := range append(rec.Fresh, rec.Started...) {
			if s.prod.Revoke(c.Slot, c.Seq) {
				revoked = append(revoked, c.Seq)
				s.board[c.Slot] = actors.Call{}
			}
		}
	}
	s.owner[l.cid].Store(nil)
	if release { // an abandoned goroutine keeps its id: it might still write its journal
		s.ids = append(s.ids, l.cid)
	}
	s.mu.Unlock()
	if s.grants {
		s.recoverGranted(l, e, rec, revoked, err)
		return
	}
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
	s.uncount(n)
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
	if s.prod.Waiting() > 0 { // safe beside the producer
		s.wake()
	}
}

// close fails every call still on the ring or its backlog once the pool has stopped its
// lanes (or given them all up): no lane will claim them.
func (s *shared) close(e *Error) {
	s.stopAudit()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	if !s.host.Closed() {
		s.host.CloseLocked() // the backlog's calls name the ring in their records: they fail below
	}
	s.mu.Unlock()
	end := actors.LaneEnd{Owner: s.p.id, Lane: sharedKey, Release: true,
		Shared: func(uint64, int32) (bool, bool) { return true, false },
		Err:    func(bool, bool) error { return e }}
	n := 0
	for _, d := range s.p.defs {
		n += d.FailLane(end)
	}
	s.uncount(n)
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

// Grants (process lanes). A lane claims from the shared ring as ever, but reads no payload
// there and runs nothing it claimed: it sends the host a claim notice on its own return ring
// (actors.ClaimNotice) and waits for the answer. The host checks each call the notice names
// against its own record (steal.Producer.Grant: the slot must still hold that call, not
// granted to anyone) and forwards each call it grants, payload and all, to the lane's own
// ring (actors.HostRing.Forward), where it runs as one of the lane's own calls: the lane's
// running word then says whether it started, and its result, marked SharedResult, must come
// from that lane (Answer). What a lane writes into the shared mapping can make claims fail,
// or name the wrong calls, never make the host grant a call twice; and the host gives the
// ring up when its audit finds it broken or stuck (degrade).

// ClaimNotice implements actors.Claimant: a notice on the lane's return ring. Its form is
// the lane's own doing (an error kills the lane); what it names comes from the shared ring,
// which any lane may have written, so a call the host does not hold there is refused, and
// makes the host give the ring up, but blames no lane.
func (l *lane) ClaimNotice(payload []byte) error {
	s := l.p.shared
	if s == nil || !s.grants || l.cid < 0 || len(payload) == 0 || len(payload)%8 != 0 || len(payload) > 8*steal.Slots {
		return fmt.Errorf("%w: claim notice of %d bytes", fastpath.ErrCorrupt, len(payload))
	}
	s.grant(l, payload)
	return nil
}

// grant answers lane l's claim notice: it grants the calls the ring still holds as named,
// forwards them to l's own ring, and then answers the notice (answerNotice).
func (s *shared) grant(l *lane, payload []byte) {
	var calls [steal.Slots]actors.Call
	var seqs [steal.Slots]uint64
	n, refused := 0, 0
	s.mu.Lock()
	for i := 0; i < len(payload); i += 8 {
		e := binary.LittleEndian.Uint64(payload[i:])
		slot, seq := int(e&63), e>>6
		if s.degraded.Load() || !s.prod.Grant(slot, seq) {
			if slot < steal.Slots && seq != 0 && s.expired[slot] == seq {
				s.expired[slot] = 0 // a slow claimant's: its call was dispatched again
				continue
			}
			refused++
			continue
		}
		calls[n], seqs[n] = s.board[slot], seq
		s.board[slot] = actors.Call{}
		n++
	}
	s.mu.Unlock()
	var again []uint64
	b := &s.books[l.cid]
	for k := range n {
		c := &calls[k]
		if c.Gone() && c.Def.Drop(sharedKey, c.ID, c.Gen) {
			// Its caller has gone: it leaves without running, as from a backlog.
			if bit := c.Abort.Load(); bit >= sharedAbortBase {
				s.host.ReleaseAbort(bit)
			}
			s.uncount(1)
			s.p.callDone()
			continue
		}
		key := grantKey{c.Def.Index(), c.ID}
		b.add(key, granted{gen: c.Gen, abort: c.Abort.Load(), seq: seqs[k]})
		s.prod.AddGranted(l.cid, 1)
		own, err := l.ring.Forward(c)
		if err != nil { // the lane takes no call now: another one will
			b.remove(key)
			s.prod.AddGranted(l.cid, -1)
			again = append(again, seqs[k])
			continue
		}
		b.setOwn(key, own)
	}
	l.answerNotice(s.degraded.Load())
	if len(again) > 0 {
		s.requeue(func(seq uint64) bool { return slices.Contains(again, seq) })
	}
	if refused > 0 && !s.degraded.Load() {
		s.degrade(fmt.Sprintf("lane %d's claim names %d calls the ring does not hold as named", l.Idx, refused))
	}
}

// answerNotice answers the lane's last claim notice: the calls granted are on its own ring
// by now. The answer is a bump of the region's open word by 2 (it stays odd: open), or,
// once the ring is given up, the word cleared: the lane claims no more.
func (l *lane) answerNotice(close bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Unmapped() {
		return
	}
	w := l.Region().Open()
	for {
		o := w.Load()
		if o&1 == 0 { // closed (retiring): it waits for no answer
			break
		}
		n := o + 2
		if close {
			n = 0
		}
		if w.CompareAndSwap(o, n) {
			break
		}
	}
	l.wake.Ring(l.laneBell)
}

// requeue dispatches again the calls of the ring that held says (by their sequence
// numbers on the ring; 0: the backlog's): they never ran. Their abort bits go back; they
// get new ones wherever they go. Calls that cannot go anywhere (the pool is closing) fail.
func (s *shared) requeue(held func(seq uint64) bool) {
	end := actors.LaneEnd{Owner: s.p.id, Lane: sharedKey, Release: true, Requeue: s.p.requeue,
		Shared: func(seq uint64, abort int32) (bool, bool) {
			if !held(seq) {
				return false, false
			}
			if abort >= sharedAbortBase {
				s.host.ReleaseAbort(abort)
			}
			return true, false
		},
		Err: func(bool, bool) error {
			return &Error{Code: CodeThreadClosed, Lane: -1, Message: "the pool closed before the call found a lane"}
		}}
	n := 0
	for _, d := range s.p.defs {
		n += d.FailLane(end)
	}
	s.uncount(n)
	s.p.callDone()
}

// grantee is the lane running the shared call published as seq: the lane the host granted
// it to, while that lane's running word shows it running (nil otherwise).
func (s *shared) grantee(seq uint64) *lane {
	for cid := range s.books {
		b := &s.books[cid]
		b.mu.Lock()
		var own uint64
		found := false
		for _, g := range b.calls {
			if g.seq == seq {
				own, found = g.own, true
				break
			}
		}
		b.mu.Unlock()
		if !found {
			continue
		}
		l := s.owner[cid].Load()
		if l == nil || !l.reaper {
			return nil
		}
		if word, ok := l.running(); ok && own != 0 && fastpath.Busy(word) && fastpath.Started(word) == own {
			return l
		}
		return nil
	}
	return nil
}

// recoverGranted settles what a dead lane held under grants: the calls granted to it and
// not answered, which started if its running word (its own region's: no other lane writes
// it) shows them started, and those its journal names as claimed and not yet noticed, which
// never ran (revoked: the ring still held them). A journal the recovery found corrupt (a
// lane wrote it) loses nothing, since the grants are the host's own record; but the ring
// may hold calls it claimed that no journal names now: the host gives the ring up.
func (s *shared) recoverGranted(l *lane, e *Error, rec steal.Recovery, revoked []uint64, rerr error) {
	held := s.books[l.cid].drain()
	s.prod.AddGranted(l.cid, -len(held))
	var started, chunk uint64
	l.mu.Lock()
	if !l.Unmapped() {
		started = fastpath.Started(l.Region().Running().Load())
		chunk = l.Region().Chunk().Load()
	}
	l.mu.Unlock()
	end := actors.LaneEnd{Owner: s.p.id, Lane: sharedKey, Release: true, Requeue: s.p.requeue, Err: laneEndError(l, e),
		Shared: func(seq uint64, abort int32) (bool, bool) {
			g, granted := held[seq]
			if !granted && !slices.Contains(revoked, seq) {
				return false, false
			}
			if abort >= sharedAbortBase { // it gets a new bit if it runs again
				s.host.ReleaseAbort(abort)
			}
			return true, granted && g.own != 0 && g.own <= started
		},
		// A granted call ran as one of the lane's own ring's: its chunk word names it so.
		SharedChunk: func(seq uint64) (int, bool) {
			if g, ok := held[seq]; ok && g.own != 0 {
				return fastpath.ChunkStarted(chunk, g.own)
			}
			return 0, false
		}}
	n := 0
	for _, d := range s.p.defs {
		n += d.FailLane(end)
	}
	s.uncount(n)
	if n > 0 || len(revoked) > 0 || rerr != nil {
		l.DebugTo(s.p.root.Named(logging.Steal), "grants recovered", zap.Int("granted", len(held)),
			zap.Int("revoked", len(revoked)), zap.Int("calls_settled", n), zap.Int("journal_fresh", len(rec.Fresh)), zap.Error(rerr))
	}
	if rerr != nil {
		s.degrade("the claim journal of lane " + fmt.Sprint(l.Idx) + " is corrupt: " + rerr.Error())
	}
	if s.host.Queued() > 0 { // recovery retired the slots the lane held
		s.flush()
	}
	s.leaving()
	s.p.callDone()
}

// degrade gives the shared ring up for good, once the host has found it written by
// something other than the protocol (its audit, a notice naming calls it does not hold, a
// corrupt journal) or stuck: every call the ring holds ungranted, and every call in its
// backlog, is dispatched again to a lane's own ring (none of them ran: a lane runs only
// what the host granted); the calls granted go on where they are; the lanes claim no more
// (their open words are cleared), new lanes get no consumer id, and calls from now on go
// to the lanes' own rings, as with private lanes. No lane is killed for it: every lane
// maps the ring writable, and the host cannot tell which one wrote a word.
func (s *shared) degrade(why string) {
	s.mu.Lock()
	if s.degraded.Load() || s.closed {
		s.mu.Unlock()
		return
	}
	s.degraded.Store(true)
	s.whyGone.Store(&why)
	revoked := s.prod.RevokeAll()
	clear(s.board[:])
	s.host.CloseLocked() // its backlog's calls are dispatched below
	s.mu.Unlock()
	s.p.root.Named(logging.Steal).Warn("the shared submit ring was written by something other than the protocol: "+
		"stealing is off for this pool, its lanes serve their own rings", zap.String("reason", why), zap.Int("calls_dispatched_again", len(revoked)))
	seqs := make(map[uint64]bool, len(revoked))
	for _, c := range revoked {
		seqs[c.Seq] = true
	}
	s.requeue(func(seq uint64) bool { return seq == 0 || seqs[seq] })
	p := s.p
	for i := range p.laneCount() {
		for _, l := range p.slots[i].lanes() {
			if l != nil && l.cid >= 0 {
				l.answerNotice(true)
			}
		}
	}
	p.signal()
}

// Degraded reports whether the ring was given up (degrade), and why.
func (s *shared) Degraded() (bool, string) {
	if w := s.whyGone.Load(); w != nil {
		return true, *w
	}
	return s.degraded.Load(), ""
}

// audit checks the mapping against the host's record every auditEvery (process lanes,
// under grants), after settling what the lanes sent (their claim notices among it): a word
// only the host writes that differs from what it wrote, a claim word no claim can have
// written, or a control block rewritten, gives the ring up at once; so does a call held
// stuck for stuckAfter (its notice not come, or claimable while a lane was free to claim
// it for half as long, rung at every audit), whatever the words say.
func (s *shared) audit(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(auditEvery)
	defer t.Stop()
	type seen struct {
		seq   uint64
		since time.Time
	}
	var first [steal.Slots]seen
	var idleSince time.Time // since when a ready lane has been free at every audit
	var lastExpiry time.Time
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if s.degraded.Load() {
			return
		}
		s.p.drainAll()
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		a := s.prod.Check()
		s.mu.Unlock()
		if a.Err != nil {
			s.degrade(a.Err.Error())
			return
		}
		now := time.Now()
		if s.changing() {
			// A lane with a consumer id is dying, recovering or starting: what it claimed
			// returns to the ring when its recovery runs, however long reaping takes on a
			// busy machine. The clocks start again once every such lane is ready.
			first, idleSince = [steal.Slots]seen{}, time.Time{}
			if a.Waiting != 0 {
				s.wake()
			}
			continue
		}
		if s.freeLane() {
			if idleSince.IsZero() {
				idleSince = now
			}
		} else {
			idleSince = time.Time{}
		}
		for slot := range first {
			bit := uint32(1) << slot
			if (a.Claimed|a.Waiting)&bit == 0 {
				first[slot] = seen{}
				continue
			}
			if first[slot].seq != a.Seq[slot] {
				first[slot] = seen{seq: a.Seq[slot], since: now}
				continue
			}
			if now.Sub(first[slot].since) < stuckAfter {
				continue
			}
			if a.Claimed&bit != 0 && a.Unretired&bit == 0 {
				// Claimed, and no notice for a second: a claimant descheduled that long on
				// a busy machine, or a lane that claims and sits. Once in a while the call
				// is taken back and dispatched again; the claimant's notice, if it comes,
				// is refused (a call is granted once), and the ring goes on. Again within
				// expireAgain, a lane is claiming calls to sit on them: the ring is given up.
				if !lastExpiry.IsZero() && now.Sub(lastExpiry) < expireAgain {
					s.degrade(fmt.Sprintf("call %d claimed in slot %d and not handed over for %v, %v after another",
						a.Seq[slot], slot, now.Sub(first[slot].since).Round(time.Millisecond), now.Sub(lastExpiry).Round(time.Millisecond)))
					return
				}
				lastExpiry = now
				s.expire(slot, a.Seq[slot])
				first[slot] = seen{}
				continue
			}
			if a.Claimed&bit != 0 { // claimed a second ago and still not retired
				s.degrade(fmt.Sprintf("call %d claimed in slot %d and not retired for %v", a.Seq[slot], slot,
					now.Sub(first[slot].since).Round(time.Millisecond)))
				return
			}
			if !idleSince.IsZero() && now.Sub(idleSince) >= stuckAfter/2 {
				s.degrade(fmt.Sprintf("call %d waiting in slot %d for %v while a lane was free to claim it", a.Seq[slot], slot,
					now.Sub(first[slot].since).Round(time.Millisecond)))
				return
			}
		}
		if a.Waiting != 0 {
			s.wake()
		}
	}
}

// expire takes back the call published as seq in slot, claimed and not noticed in time
// (audit), and dispatches it again: it never ran, since a lane runs only what the host
// granted.
func (s *shared) expire(slot int, seq uint64) {
	s.mu.Lock()
	ok := s.prod.Revoke(slot, seq)
	if ok {
		s.board[slot] = actors.Call{}
		s.expired[slot] = seq
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	s.p.root.Named(logging.Steal).Info("a call claimed from the shared ring was not handed over in time: dispatched again",
		zap.Uint64("seq", seq), zap.Int("slot", slot), zap.Duration("after", stuckAfter))
	s.requeue(func(q uint64) bool { return q == seq })
	if s.host.Queued() > 0 { // its slot is free again
		s.flush()
	}
}

// changing reports whether a lane incarnation holding a consumer id is not ready: booting,
// or ended and not yet recovered (recover clears its owner entry).
func (s *shared) changing() bool {
	for c := range s.owner {
		if l := s.owner[c].Load(); l != nil && l.State() != lifecycle.LaneReady {
			return true
		}
	}
	return false
}

// freeLane reports whether a ready lane of the ring is free to claim (its running word
// says not busy).
func (s *shared) freeLane() bool {
	p := s.p
	for i := range p.laneCount() {
		l := p.slots[i].cur.Load()
		if l == nil || l.cid < 0 || l.State() != lifecycle.LaneReady {
			continue
		}
		if word, ok := l.running(); ok && !fastpath.Busy(word) {
			return true
		}
	}
	return false
}
