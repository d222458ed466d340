package actors

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/knitgo/knit/fastpath"
)

// Call is a call on its way to a lane: what the host writes into a submit ring's slot, or
// keeps in a ring's backlog until a slot frees. Its pointers are its record's fields.
type Call struct {
	Def         Def
	ID, Gen     uint32
	Lane, Abort *atomic.Int32   // the record's lane and abort-bit fields, set by the ring that takes it
	Seq         *atomic.Uint64  // the record's sequence number, set when it is published
	Payload     []byte          // the encoded input (process lanes)
	Done        <-chan struct{} // the caller's context's Done (nil: it cannot end); a ring with abort bits gives such a call one
	Deadline    int64           // the caller's deadline in Unix nanoseconds, 0 for none (process lanes)
	Local       LocalCall       // the record itself, for a LocalLane (goroutine lanes)
}

// Producer is a submit ring's producer as a HostRing publishes on it: a lane's own request
// ring (LaneProducer) or a stealing pool's shared ring (*steal.Producer, which reserves any
// free slot, as its consumers retire them out of order). It is used under the ring's mutex.
type Producer interface {
	Reserve() (slot int, ok bool)
	Put(slot, n int) ([]byte, error)
	Slot(i int) fastpath.Slot
	Release(slot int)
	// Stage marks slot, whose header and payload are written, ready for the next Flush, and
	// returns the sequence number it gave the call.
	Stage(slot int) uint64
	Flush() bool
}

// LaneProducer is a lane's own request ring as a Producer: slots in cyclic order, which the
// lane runs in order, numbered one by one in their headers (the lane's running word names
// the last it started, which tells the host after a death which calls never ran).
type LaneProducer struct {
	*fastpath.Producer
	seq uint64 // the sequence number of the last call staged
}

// Stage implements Producer.
func (p *LaneProducer) Stage(slot int) uint64 { return p.stage(slot, p.Producer.Slot(slot)) }

// stage is Stage for a caller that holds the slot already (s is slot).
func (p *LaneProducer) stage(slot int, s fastpath.Slot) uint64 {
	p.seq++
	s.SetSeq(p.seq)
	p.Producer.Stage(slot)
	return p.seq
}

// RingOwner is what differs between the owners of HostRings (a lane, a stealing pool's
// shared ring): the HostRing calls it at these points.
type RingOwner interface {
	// Admit says, with the ring's mutex held, whether the ring takes a call now (nil), or
	// the error Submit returns.
	Admit() error
	// Accept counts a call as held by the owner: with the mutex held, before the call is
	// published, so that whoever settles it finds it counted. calls is how many calls it
	// stands for: a Map chunk's elements if RingConfig.CountChunks is set, else 1.
	Accept(calls int)
	// Published wakes the ring's consumers: calls were published. The mutex is not held.
	Published()
	// AbortRaised wakes the abort watchers of every lane that may run a call whose abort bit
	// was just raised. The mutex is held.
	AbortRaised()
	// Dropped uncounts calls Accept counted that left the backlog without running: their
	// callers had gone (settled already by their context). The mutex is held.
	Dropped(n int)
}

// Result is a result slot as the lane published it, read and checked: its task is served
// here, and on a Remote lane the abort bit it gives back belonged to its call (and is free
// again).
type Result struct {
	Def     Def
	Key     int32 // the ring the call was published on: what its record's Lane field names
	Shared  bool  // it came from the shared ring (RingConfig.Shared), not the lane's own
	ID, Gen uint32
	Outcome Outcome
	Ran     uint64 // how long the call ran on the lane, in nanoseconds (0: not timed)
	Payload []byte // in shared memory: decode it before SettleResult returns
}

// SharedOwner is what the owner of a stealing pool's shared ring may do beyond RingOwner;
// NewHostRing looks for it.
type SharedOwner interface {
	// Staged learns, with the ring's mutex held, which call was staged in slot with seq:
	// the host forwards it to the lane its claim is granted to (Forward).
	Staged(slot int, seq uint64, c Call)
	// Answer checks, before a call of the shared ring settles, that the lane whose ring
	// (by) answered it holds it, with the abort bit it was given (abort is the result
	// slot's field: the bit + 1, 0 for none; 0 from an in-process lane); an error means that
	// lane broke the protocol. It uncounts the call before its caller wakes.
	Answer(by RingOwner, fn, id, gen, abort uint32) error
}

// Claimant is a lane's Settler that takes claim notices: what the lane claimed from the
// pool's shared ring, sent on its own return ring (a slot marked ClaimNotice), for the host
// to grant. An error means the notice broke the protocol: the lane must die.
type Claimant interface {
	ClaimNotice(payload []byte) error
}

// ClaimNotice marks a result slot's flags: not a result, a claim notice (with
// SharedResult): its payload lists what the lane claimed from the shared ring, 8 bytes per
// call (little endian seq<<6 | slot).
const ClaimNotice uint32 = 1 << 30

// Settler settles the results a HostRing reads from its return ring: the lane that owns it.
// An interface, not a function value: a method value is called through a wrapper, and
// either way the call is not inlined; a result goes by value, as a pointer passed through
// an interface escapes.
type Settler interface {
	// SettleResult does the owner's accounting for a result the ring has checked and
	// settles its call. An error means the result broke the protocol (Drain returns it).
	SettleResult(Result) error
}

// RingConfig configures a HostRing.
type RingConfig struct {
	// Mu is the owner's mutex, which guards the ring's producer, backlog and abort bits
	// (the owner guards more with it: a lane, whether its region is still mapped).
	Mu            *sync.Mutex
	Owner         RingOwner
	Submit        Producer
	Key           int32 // names the ring in call records
	Backlog       int   // calls queued beyond the ring's slots (at least 1)
	BlockWhenFull bool  // renew the channel a full backlog's BacklogFull carries when calls move
	// Aborts are the abort bits calls on the ring get (none when empty: calls of goroutine
	// lanes cannot be interrupted); slot headers and records name bit i as AbortBase+i.
	Aborts    fastpath.Bitmap
	AbortBase int32

	// The return ring (nil: the ring's calls are answered elsewhere, as the shared ring's
	// are, on the return ring of the lane that claimed each), and how its results settle.
	Returns *fastpath.Consumer
	Tasks   []Def // by function index: the tasks served
	Settle  Settler
	// Remote: the lane is another process; see Drain.
	Remote bool
	// CountChunks has Accept count a Map chunk as its elements (Calls), not as one call.
	CountChunks bool
	// Shared is the pool's shared ring, whose calls the lane may answer on its return ring
	// (SharedResult), freeing its slots (nil: the pool does not steal).
	Shared *HostRing
	// Room rings the lane, parked until its full return ring has room, once a drain has
	// retired slots (nil: the lane never parks for room).
	Room func()
	// HeadersOnly: a shared ring whose lanes never read payloads there (the host forwards
	// each granted call, payload and all, to its claimant's own ring): payloads are not
	// copied in.
	HeadersOnly bool
}

// HostRing is the host end of a lane's rings: the producer of a submit ring, shared by every
// caller under the owner's mutex, with the FIFO backlog of calls beyond its 32 slots and the
// abort bits of its calls; and the consumer of the return ring its calls are answered on,
// which one drainer at a time settles (callers waiting for results, a reaper, the lane
// goroutine itself). A stealing pool's shared ring is one too, without a return ring.
//
// It lives in actors, beside the lane's end (Executor) and the call records, because it is
// the other half of the same protocol: what it writes into a slot is what Executor reads,
// and what Executor publishes it settles into a Record through its Def. It never decides
// where a call goes or what happens when a lane dies: its owner (the pool's lane, or its
// shared ring) does, through RingOwner and its Settler.
type HostRing struct {
	mu      *sync.Mutex
	owner   RingOwner
	prod    Producer
	lane    *LaneProducer // prod, when it is one: called directly, on every call's path
	key     int32
	block   bool
	chunks  bool   // Accept counts a Map chunk's elements (RingConfig.CountChunks)
	backlog []Call // FIFO ring of calls beyond the 32 slots
	head, n int
	space   chan struct{} // closed when the backlog frees room (BlockWhenFull)
	closed  bool          // nothing is published again
	queued  atomic.Int32  // n, readable without mu
	// publishing counts the submitters between publishing calls under mu and ringing the
	// consumer after it (RingOwner.Published, which may touch the region): Quiesce waits
	// for them before the region can go.
	publishing atomic.Int32

	aborts    fastpath.Bitmap
	abortBase int32
	bits      abortBits // who holds which bit of aborts

	ret      *fastpath.Consumer
	tasks    []Def
	settle   Settler
	remote   bool
	shared   *HostRing
	room     func()
	draining atomic.Bool
	fenced   atomic.Bool // the return ring is never read again

	sharedOwner SharedOwner // owner, if it is one (a shared ring)
	headersOnly bool
}

// NewHostRing returns the host end of a ring.
func NewHostRing(c RingConfig) *HostRing {
	lane, _ := c.Submit.(*LaneProducer)
	so, _ := c.Owner.(SharedOwner)
	return &HostRing{
		mu: c.Mu, owner: c.Owner, prod: c.Submit, lane: lane, key: c.Key, block: c.BlockWhenFull, chunks: c.CountChunks,
		backlog: make([]Call, max(c.Backlog, 1)), space: make(chan struct{}),
		aborts: c.Aborts, abortBase: c.AbortBase, bits: newAbortBits(c.Aborts.Len()),
		ret: c.Returns, tasks: c.Tasks, settle: c.Settle, remote: c.Remote, shared: c.Shared, room: c.Room,
		sharedOwner: so, headersOnly: c.HeadersOnly,
	}
}

// calls is what Accept counts for c.
func (r *HostRing) calls(c *Call) int {
	if !r.chunks {
		return 1
	}
	return Calls(c.Def, c.Payload)
}

// BacklogFull is Submit's error when the backlog is full. Space is closed when it has room
// again (with BlockWhenFull; else when the ring closes).
type BacklogFull struct{ Space <-chan struct{} }

func (*BacklogFull) Error() string { return "backlog full" }

// errNotShared: a lane answered a call of a shared ring in a pool that has none.
var errNotShared = errors.New("result of a shared call in a pool without work stealing")

// Submit publishes c, or queues it in the backlog when the ring is full or its arena has no
// room for the payload now. It fails with the owner's Admit error, or *BacklogFull. It keeps
// no pointer to c (a pointer spares the call path copies of it).
func (r *HostRing) Submit(c *Call) (queued bool, err error) {
	r.mu.Lock()
	if err := r.owner.Admit(); err != nil {
		r.mu.Unlock()
		return false, err
	}
	// A full backlog refuses the call even when slots are free: its calls go first, with
	// the drainer's flush. (It holds one call at least: NewHostRing.) Calls whose callers
	// have gone make room first.
	if r.n == len(r.backlog) && r.dropGoneLocked() == 0 {
		space := r.space
		r.mu.Unlock()
		return false, &BacklogFull{Space: space}
	}
	// The ring takes the call: it is marked as on this ring, with an abort bit, and
	// counted by the owner before it is published (here, not in a method of its own: a
	// call more on every call's path).
	c.Lane.Store(r.key)
	if r.aborts.Len() > 0 {
		r.allocAbort(c)
	}
	r.owner.Accept(r.calls(c))
	if r.n == 0 {
		var slot int
		var ok bool
		if p := r.lane; p != nil { // a lane's own ring: no call through Producer
			slot, ok = p.Reserve()
		} else {
			slot, ok = r.prod.Reserve()
		}
		if ok {
			if r.publish(slot, c) {
				if p := r.lane; p != nil {
					p.Flush()
				} else {
					r.prod.Flush()
				}
				r.published(true)
				return false, nil
			}
			r.enqueue(*c)
			r.mu.Unlock()
			return true, nil
		}
	}
	r.enqueue(*c)
	// The consumers may have retired every slot (and a lane drained its last result) between
	// the failed Reserve and the enqueue, and then found no backlog to flush: look again now.
	// (enqueue's store of queued and Reserve's load of the consumer word pair with the
	// consumer's Retire and the drainer's load of queued.)
	moved := r.flushLocked()
	r.published(moved)
	return true, nil
}

// published unlocks mu and, if calls were published, rings the consumer (outside mu: the
// ring may be a futex wake), counted in publishing meanwhile.
func (r *HostRing) published(moved bool) {
	if !moved {
		r.mu.Unlock()
		return
	}
	r.publishing.Add(1)
	r.mu.Unlock()
	r.owner.Published()
	r.publishing.Add(-1)
}

// Quiesce waits until no submitter is still ringing the consumer for calls it published
// before the ring closed. The owner calls it once the ring is closed (CloseLocked) and
// before it unmaps the region: a submitter descheduled between its unlock and its ring
// would otherwise touch a region that is gone.
func (r *HostRing) Quiesce() {
	for r.publishing.Load() != 0 {
		runtime.Gosched()
	}
}

// SubmitBatch is Submit for calls, oldest first, under one hold of the mutex: it publishes
// those that find a free slot with one store of the producer word, queues the others in the
// backlog, and wakes the consumer once. It returns how many it took, the first ones (all of
// them unless the backlog filled: then with *BacklogFull), or the owner's Admit error with
// none. It keeps no pointer into calls.
func (r *HostRing) SubmitBatch(calls []Call) (taken int, err error) {
	r.mu.Lock()
	if err := r.owner.Admit(); err != nil {
		r.mu.Unlock()
		return 0, err
	}
	staged, queued := false, false
	for i := range calls {
		c := &calls[i]
		if r.n == len(r.backlog) && r.dropGoneLocked() == 0 {
			break
		}
		c.Lane.Store(r.key)
		if r.aborts.Len() > 0 {
			r.allocAbort(c)
		}
		r.owner.Accept(r.calls(c))
		taken++
		if r.n == 0 {
			var slot int
			var ok bool
			if p := r.lane; p != nil {
				slot, ok = p.Reserve()
			} else {
				slot, ok = r.prod.Reserve()
			}
			if ok && r.publish(slot, c) {
				staged = true
				continue
			}
		}
		r.enqueue(*c)
		queued = true
	}
	if staged { // one store for every call published
		if p := r.lane; p != nil {
			p.Flush()
		} else {
			r.prod.Flush()
		}
	}
	if queued && r.flushLocked() { // as in Submit: the consumers may have made room meanwhile
		staged = true
	}
	space := r.space
	r.published(staged)
	if taken < len(calls) {
		return taken, &BacklogFull{Space: space}
	}
	return taken, nil
}

// allocAbort gives a cancellable call an abort bit, raised at once if its caller has given
// up already. Called with mu held, on a ring with abort bits.
func (r *HostRing) allocAbort(c *Call) {
	bit := int32(-1) // none: all are taken, or the call cannot be cancelled
	if c.Done != nil {
		bit = r.bits.alloc(c.Def.Index(), c.ID)
	}
	if bit >= 0 {
		select {
		case <-c.Done:
			// The caller gave up while the call looked for a lane (a Go future's
			// context, or a call run again after its lane died): its expiry may have
			// looked for the call on no lane or another one, so raise the bit here, or
			// the task would run on until its lane dies.
			r.raiseLocked(bit)
		default:
		}
		bit += r.abortBase
	}
	c.Abort.Store(bit)
}

// enqueue appends an accepted call to the backlog. Called with mu held.
func (r *HostRing) enqueue(c Call) {
	c.Seq.Store(0) // not published: it has not started, whatever it carried before
	r.backlog[(r.head+r.n)%len(r.backlog)] = c
	r.n++
	r.queued.Swap(int32(r.n)) // a full barrier before the flush's reload of the consumer word
}

// publish writes c into a reserved slot and stages it (the caller flushes); false means the
// arena has no room for its payload now (the slot is given back and c waits in the
// backlog). Goroutine lanes carry no payload: the value stays on the call's record. Called
// with mu held.
//
// On a lane's own ring (r.lane) the producer's methods are called directly, in a path of
// their own: a call through Producer, or a small wrapper method that chooses, is not
// inlined and costs every call of a goroutine lane a few percent (so does a helper for the
// header's four fields, which the interface call to Index keeps from being inlined).
func (r *HostRing) publish(slot int, c *Call) bool {
	if p := r.lane; p != nil {
		if len(c.Payload) == 0 {
			p.Empty(slot) // a goroutine lane's call: its value stays on its record
		} else if buf, err := p.Put(slot, len(c.Payload)); err == nil {
			copy(buf, c.Payload)
		} else {
			p.Release(slot)
			return false
		}
		s := p.Slot(slot)
		s.SetFn(c.Def.Index())
		s.SetCall(c.ID, c.Gen)
		s.SetAbort(uint32(c.Abort.Load() + 1))
		s.SetDeadline(c.Deadline)
		s.SetFlags(0) // not a forwarded call (Forward)
		c.Seq.Store(p.stage(slot, s))
		return true
	}
	n := len(c.Payload)
	if r.headersOnly {
		n = 0
	}
	buf, err := r.prod.Put(slot, n)
	if err != nil {
		r.prod.Release(slot)
		return false
	}
	copy(buf, c.Payload)
	s := r.prod.Slot(slot)
	s.SetFn(c.Def.Index())
	s.SetCall(c.ID, c.Gen)
	s.SetAbort(uint32(c.Abort.Load() + 1))
	s.SetDeadline(c.Deadline)
	seq := r.prod.Stage(slot)
	c.Seq.Store(seq)
	if r.sharedOwner != nil {
		r.sharedOwner.Staged(slot, seq, *c)
	}
	return true
}

// Withdraw takes back the calls queued behind the one lane's own ring is running, which
// then run on other lanes: the calls it has published that the lane has not started (gate
// decides which, see fastpath.Gate) and every call of the backlog, whose abort bits it
// frees. It returns the sequence number of the last call that stays on the lane; the owner
// moves the calls' records (Def.Withdraw with that as LaneEnd.Started) and uncounts them.
// When the gate takes no published call back (the lane started one meanwhile, or an earlier
// Withdraw's fence covers them all), only the backlog moves; ok is false, and nothing taken,
// when there is nothing to move. Called with mu held.
func (r *HostRing) Withdraw(gate fastpath.Gate) (started uint64, ok bool) {
	if r.lane == nil || r.closed {
		return 0, false
	}
	from, ok := gate.Fence(r.lane.seq)
	started = from - 1
	if !ok {
		// The published calls stay where they are (the lane started one, or an earlier
		// fence took every one). The backlog's calls were never published: they move.
		if r.n == 0 {
			return 0, false
		}
		started = r.lane.seq
	}
	for r.n > 0 {
		c := &r.backlog[r.head]
		if bit := c.Abort.Load(); bit >= 0 && r.aborts.Len() > 0 {
			if b := bit - r.abortBase; r.bits.release(b) {
				r.aborts.Clear(int(b))
			}
		}
		r.backlog[r.head] = Call{}
		r.head = (r.head + 1) % len(r.backlog)
		r.n--
	}
	r.queued.Store(0)
	if r.block {
		close(r.space)
		r.space = make(chan struct{})
	}
	return started, true
}

// errForward: Forward found no room on the lane's ring, or the lane takes no calls.
var errForward = errors.New("the lane's ring takes no forwarded call now")

// Forward publishes on this ring (a lane's own) a call of the pool's shared ring that the
// lane claimed and the host granted it: the lane runs it as one of its own calls (its
// running word tells the host whether it started) and answers it marked SharedResult. The
// call's record is left as it is (it stays the shared ring's, with its abort bit there).
// It returns the call's sequence number on this ring, or an error when the ring takes no
// call now (the lane is not ready, or its slots or arena are full): the host then
// dispatches the call again. The caller wakes the lane.
func (r *HostRing) Forward(c *Call) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.lane
	if p == nil || r.closed {
		return 0, errForward
	}
	if err := r.owner.Admit(); err != nil {
		return 0, err
	}
	slot, ok := p.Reserve()
	if !ok {
		return 0, errForward
	}
	if len(c.Payload) == 0 {
		p.Empty(slot)
	} else if buf, err := p.Put(slot, len(c.Payload)); err == nil {
		copy(buf, c.Payload)
	} else {
		p.Release(slot)
		return 0, errForward
	}
	s := p.Slot(slot)
	s.SetFn(c.Def.Index())
	s.SetCall(c.ID, c.Gen)
	s.SetAbort(uint32(c.Abort.Load() + 1))
	s.SetDeadline(c.Deadline)
	s.SetFlags(SharedResult)
	seq := p.stage(slot, s)
	p.Flush()
	return seq, nil
}

// Queued is how many calls wait in the backlog.
func (r *HostRing) Queued() int32 { return r.queued.Load() }

// Flush moves backlog calls into free slots.
func (r *HostRing) Flush() {
	r.mu.Lock()
	r.published(r.flushLocked())
}

// flushLocked moves backlog calls, oldest first, into free slots; mu is held. It reports
// whether it moved any.
func (r *HostRing) flushLocked() bool {
	if r.closed {
		return false
	}
	moved := 0
	for r.n > 0 {
		if c := &r.backlog[r.head]; c.Gone() && r.drop(c) {
			// Its caller has gone: it leaves without running (a cancel storm then costs
			// the lane nothing once it ends).
			r.backlog[r.head] = Call{}
			r.head = (r.head + 1) % len(r.backlog)
			r.n--
			moved++ // room in the backlog, like a move
			continue
		}
		var slot int
		var ok bool
		if p := r.lane; p != nil {
			slot, ok = p.Reserve()
		} else {
			slot, ok = r.prod.Reserve()
		}
		if !ok || !r.publish(slot, &r.backlog[r.head]) {
			break
		}
		r.backlog[r.head] = Call{}
		r.head = (r.head + 1) % len(r.backlog)
		r.n--
		moved++
	}
	if p := r.lane; p != nil { // one store for the whole burst
		p.Flush()
	} else {
		r.prod.Flush()
	}
	r.queued.Store(int32(r.n))
	if moved > 0 && r.block {
		close(r.space)
		r.space = make(chan struct{})
	}
	return moved > 0
}

// Gone reports whether the call's caller has given up on it.
func (c *Call) Gone() bool {
	if c.Done == nil {
		return false
	}
	select {
	case <-c.Done:
		return true
	default:
		return false
	}
}

// drop takes a call whose caller has gone out of the backlog: it frees its abort bit and
// the ring's reference to its record, and the owner uncounts it. Its caller settles it, as
// a caller does whenever its context ends. Called with mu held.
func (r *HostRing) drop(c *Call) bool {
	if !c.Def.Drop(r.key, c.ID, c.Gen) {
		return false
	}
	if bit := c.Abort.Load(); bit >= 0 && r.aborts.Len() > 0 {
		if b := bit - r.abortBase; r.bits.release(b) {
			r.aborts.Clear(int(b))
		}
	}
	r.owner.Dropped(1)
	return true
}

// dropGoneLocked drops every backlog call whose caller has gone, keeping the others in
// order, and reports how many it dropped. Called with mu held, when the backlog is full.
func (r *HostRing) dropGoneLocked() int {
	kept, dropped := 0, 0
	for i := range r.n {
		c := &r.backlog[(r.head+i)%len(r.backlog)]
		if c.Gone() && r.drop(c) {
			dropped++
			continue
		}
		r.backlog[(r.head+kept)%len(r.backlog)] = *c
		kept++
	}
	for i := kept; i < r.n; i++ {
		r.backlog[(r.head+i)%len(r.backlog)] = Call{}
	}
	r.n = kept
	r.queued.Store(int32(r.n))
	return dropped
}

// Closed reports whether CloseLocked has run. Called with mu held.
func (r *HostRing) Closed() bool { return r.closed }

// CloseLocked drops the backlog for good and wakes blocked submitters: nothing is published
// again. The calls it held name the ring in their records: the owner fails them there.
// Called with mu held.
func (r *HostRing) CloseLocked() {
	r.closed = true
	clear(r.backlog)
	r.head, r.n = 0, 0
	r.queued.Store(0)
	close(r.space)
}

// RaiseAbortLocked sets a call's abort bit (as its record names it) if it still belongs to
// the call, and has the owner wake the abort watchers. Called with mu held, by an owner
// that knows the bitmap is still mapped.
func (r *HostRing) RaiseAbortLocked(bit int32, fn, id uint32) {
	if b := bit - r.abortBase; r.bits.holds(b, fn, id) {
		r.raiseLocked(b)
	}
}

func (r *HostRing) raiseLocked(b int32) {
	r.aborts.Set(int(b))
	r.owner.AbortRaised()
}

// FreeAbort returns a settled call's abort bit (as its record names it). A bit the call
// does not hold means the lane that answered broke the protocol.
func (r *HostRing) FreeAbort(bit int32, fn, id uint32) error {
	b := bit - r.abortBase
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.bits.holds(b, fn, id) {
		return fmt.Errorf("%w: abort bit %d does not belong to call %d", fastpath.ErrCorrupt, bit, id)
	}
	r.bits.release(b)
	r.aborts.Clear(int(b))
	return nil
}

// ReleaseAbort frees an abort bit (as a record names it) whoever holds it: its call is
// settled without a result, or runs again and gets a new one.
func (r *HostRing) ReleaseAbort(bit int32) {
	r.mu.Lock()
	if b := bit - r.abortBase; r.bits.release(b) {
		r.aborts.Clear(int(b))
	}
	r.mu.Unlock()
}

// Drain settles every result waiting on the return ring, unless someone else is draining,
// and then moves backlog calls into the slots those results freed (its own ring's, and the
// shared ring's). It reports how many results it took, and the error of one that broke the
// protocol: the lane must die, and the results after it in its batch settled nothing.
//
// It looks at the ring only while it holds draining: Fence takes it before fencing the
// ring, so a drainer never touches a region that is being unmapped. A goroutine lane's
// region is never unmapped: after letting go, Drain looks again there, so that a result
// published while it held the flag, whose producer found it taken, is still drained. (A
// Remote lane's results are found by the reaper or a spinning caller, which loop.)
func (r *HostRing) Drain() (settled int, err error) {
	for {
		if !r.draining.CompareAndSwap(false, true) {
			return settled, nil
		}
		if r.fenced.Load() {
			r.draining.Store(false)
			return settled, nil
		}
		pending := r.ret.Poll()
		if pending == 0 {
			r.draining.Store(false)
			if r.remote || r.ret.Peek() == 0 {
				return settled, nil
			}
			continue
		}
		settled += bits.OnesCount32(pending)
		if r.remote {
			// A result from another process is caused by a request we published under mu,
			// but Go's memory model (and the race detector, which does not track mapped
			// memory) cannot see through that process: taking mu orders what callers wrote
			// before publishing (their call records) before what we read now.
			r.mu.Lock()
			//lint:ignore SA2001 the empty critical section is the point
			r.mu.Unlock()
		}
		for i := range r.ret.Slots(pending) { // Take's loop, inlined on the hot path
			if err = r.settleSlot(i); err != nil {
				break
			}
		}
		r.ret.Retire(pending)
		if r.room != nil && r.ret.RoomWanted() {
			r.room() // the lane parked for room: there is some now (and the region is mapped while draining is held)
		}
		r.draining.Store(false)
		if err != nil {
			return settled, err
		}
		r.FlushBacklogs()
		if r.remote || r.ret.Peek() == 0 {
			return settled, nil
		}
	}
}

// SettleLocal settles the result of a call an in-process lane has just run (its value is on
// the call's record), as Drain settles one read off the return ring, without the trip
// through the ring; the lane goroutine calls it. Once the ring is fenced (the lane was
// abandoned, and its calls settled without it) nothing is settled. Unlike Drain it moves
// no backlog calls: the lane does that once per batch (FlushBacklogs), not once per call,
// which would take the mutex every caller submits under once per call.
func (r *HostRing) SettleLocal(fn, id, gen uint32, o Outcome, shared bool, ran uint64) error {
	for !r.draining.CompareAndSwap(false, true) { // a Fence or a drain of older results
		runtime.Gosched()
	}
	if r.fenced.Load() {
		r.draining.Store(false)
		return nil
	}
	var err error
	from := r
	switch {
	case int(fn) >= len(r.tasks) || r.tasks[fn] == nil:
		err = fmt.Errorf("%w: result for function %d", fastpath.ErrCorrupt, fn)
	case shared && r.shared == nil:
		err = fmt.Errorf("%w: %w", fastpath.ErrCorrupt, errNotShared)
	default:
		if shared {
			from = r.shared
			if a := from.sharedOwner; a != nil {
				if err = a.Answer(r.owner, fn, id, gen, 0); err != nil {
					break
				}
			}
		}
		err = r.settle.SettleResult(Result{Def: r.tasks[fn], Key: from.key, Shared: shared, ID: id, Gen: gen, Outcome: o, Ran: ran})
	}
	r.draining.Store(false)
	return err
}

// FlushBacklogs moves waiting calls into the request slots a lane has freed: this ring's
// backlog and the shared ring's. Drain calls it after each drained batch; an in-process
// lane calls it once its batch has run.
func (r *HostRing) FlushBacklogs() {
	if r.queued.Load() > 0 {
		r.Flush()
	}
	if sh := r.shared; sh != nil && sh.queued.Load() > 0 {
		sh.Flush()
	}
}

// Waiting reports whether results wait on the return ring. Safe beside a drainer.
func (r *HostRing) Waiting() bool { return r.ret.Peek() != 0 }

// Fence stops the return ring for good once the lane has ended: it waits for the drainer,
// settles what the lane published before it ended (release; an abandoned lane's results
// are not read: it may still be writing them), and fences the ring, which Drain never
// reads again: the owner may unmap it.
func (r *HostRing) Fence(release bool) {
	for !r.draining.CompareAndSwap(false, true) {
		runtime.Gosched()
	}
	if release { // the lane is gone: what it published before it ended still counts
		_ = r.ret.Take(r.ret.Poll(), r.settleSlot)
	}
	r.fenced.Store(true)
	r.draining.Store(false)
}

// settleSlot reads and checks result slot i and has the owner settle it. Every field is
// hostile: a bad one is an error wrapping fastpath.ErrCorrupt, never a panic.
func (r *HostRing) settleSlot(i int) error {
	s := r.ret.Slot(i)
	flags := s.Flags()
	if flags&ClaimNotice != 0 { // what the lane claimed from the shared ring, for grants
		c, ok := r.settle.(Claimant)
		if !ok || r.shared == nil || flags != SharedResult|ClaimNotice {
			return fmt.Errorf("%w: claim notice with flags %#x", fastpath.ErrCorrupt, flags)
		}
		payload, err := r.ret.Payload(i)
		if err != nil {
			return err
		}
		return c.ClaimNotice(payload)
	}
	fn := s.Fn()
	if int(fn) >= len(r.tasks) || r.tasks[fn] == nil {
		return fmt.Errorf("%w: result for function %d", fastpath.ErrCorrupt, fn)
	}
	from := r
	if flags&SharedResult != 0 { // a call the lane claimed from the shared ring
		if from = r.shared; from == nil {
			return fmt.Errorf("%w: %w", fastpath.ErrCorrupt, errNotShared)
		}
	}
	payload, err := r.ret.Payload(i)
	if err != nil {
		return err
	}
	if a := from.sharedOwner; a != nil { // the lane must hold the call it answers
		if err := a.Answer(r.owner, fn, s.Call(), s.Gen(), s.Abort()); err != nil {
			return err
		}
	}
	if bit := int32(s.Abort()) - 1; bit >= 0 && r.remote {
		if err := from.FreeAbort(bit, fn, s.Call()); err != nil {
			return err
		}
	}
	if Outcome(flags) == Withdrawn {
		// A call the host took back (Withdraw) and runs elsewhere: the slot only gives its
		// abort bit back. (A lane that answers a call it holds so withholds the answer, as
		// a lane that never answers does: the call's deadline or the lane's end settles it.)
		return nil
	}
	return r.settle.SettleResult(Result{Def: r.tasks[fn], Key: from.key, Shared: from != r, ID: s.Call(), Gen: s.Gen(),
		Outcome: Outcome(flags &^ SharedResult), Ran: s.Seq(), Payload: payload})
}

// abortBits hands a bitmap's abort bits to cancellable calls. The ring's mutex guards it.
type abortBits struct {
	owner []uint64 // owner[bit] names the call holding it (abortOwner), 0 when free
	free  []int32
}

func newAbortBits(n int) abortBits {
	a := abortBits{owner: make([]uint64, n)}
	for i := range n {
		a.free = append(a.free, int32(n-1-i))
	}
	return a
}

// abortOwner names a call by task and record: record ids are per task.
func abortOwner(fn, id uint32) uint64 { return uint64(fn)<<32 | uint64(id) + 1 }

// alloc gives call id of task fn a bit, or -1 when all are taken (the call can then be
// settled by its caller but not interrupted on its lane).
func (a *abortBits) alloc(fn, id uint32) int32 {
	n := len(a.free)
	if n == 0 {
		return -1
	}
	bit := a.free[n-1]
	a.free = a.free[:n-1]
	a.owner[bit] = abortOwner(fn, id)
	return bit
}

// holds reports whether bit belongs to call id of task fn.
func (a *abortBits) holds(bit int32, fn, id uint32) bool {
	return bit >= 0 && int(bit) < len(a.owner) && a.owner[bit] == abortOwner(fn, id)
}

// release frees bit, whoever held it; it reports whether it was held.
func (a *abortBits) release(bit int32) bool {
	if bit < 0 || int(bit) >= len(a.owner) || a.owner[bit] == 0 {
		return false
	}
	a.owner[bit] = 0
	a.free = append(a.free, bit)
	return true
}
