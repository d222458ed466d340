package knit

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/zap"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/logging"
	"github.com/knitgo/knit/internal/spin"
	"github.com/knitgo/knit/internal/stamp"
	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/remote"
)

// NodeConfig configures a node (ServeNode).
type NodeConfig struct {
	// Addr is where the node listens, host:port (":7400": every interface; port 0: a free
	// one, which Ready reports). Hosts list the address they reach it at in
	// RemoteConfig.Nodes.
	Addr string
	// TLS, if set, makes every connection mutual TLS: hosts must present a certificate
	// that TLS.ClientCAs (or RootCAs) verifies, or they are refused; the node presents
	// TLS.Certificates and verifies the hosts' against RootCAs when it sends them results.
	// Nil: plaintext, for a trusted network only (docs/remote.md, "TLS").
	TLS *tls.Config
	// MaxLanes bounds the lanes the node runs for all its hosts together (default 64, at
	// most 4096): an Open beyond it fails that lane's start.
	MaxLanes int
	// Process configures the node's lane processes, as Config.Process does a pool's
	// (Command, Prefix, Env, Spares, Limits, Sandbox, SharedMemory); MaxLaneMemory is not
	// used. The hosts' own process settings do not reach the node.
	Process ProcessConfig
	// StopAckTimeout, KillGrace and StartupTimeout are Config's, for the node's lanes
	// (zero: Config's defaults). Liveness is its watchdog of frozen lane processes (not the
	// host's heartbeat, which the host's Config.Liveness sets; negative: off).
	StopAckTimeout, KillGrace, StartupTimeout, Liveness time.Duration
	// LaneSpin and CallerSpin are Config's, for the node's lanes, except that a zero
	// LaneSpin means: a lane parks as soon as it has run out of calls (they come a network
	// frame at a time, tens of microseconds apart at best, and a lane that polls between
	// frames takes the core the node's own transport needs), unless its calls come one at
	// a time (actors.OneAtATime single-call batches in a row): then it polls for the next
	// for up to 1ms, a network round trip, which the wake-up of a parked lane would
	// lengthen by tens of microseconds (the lowest GOMAXPROCS−1 lanes only; docs/remote.md,
	// "Figures"). Negative: lanes never poll.
	LaneSpin, CallerSpin time.Duration
	// Logger receives the node's logs, and its lanes' output (default: as Config.Logger).
	Logger *zap.Logger
	// Ready, if set, is called once the node listens, with its address (the port it got,
	// for port 0).
	Ready func(addr string)
}

// Node bounds.
const (
	defaultNodeLanes = 64
	maxNodeLanes     = 4096
	// maxNodeArena bounds the arena a host may ask a node to map per lane and direction.
	maxNodeArena = 64 << 20
)

// ServeNode runs a node: an agent that hosts lanes for pools on other machines (their
// Config.Runtime is Remote and their RemoteConfig.Nodes list this node), each a process
// lane of this binary, with the shared-memory fast path between the agent and the lane. It
// must run in the application's own binary, after Main, which serves those lanes; the
// binary defines the tasks, and a host's tasks must be defined here with the same types
// (their fingerprints are compared before a lane serves).
//
// It returns when ctx ends, after killing every lane it runs (their hosts count their calls
// as in doubt: NODE_LOST), or at once with an error when it cannot listen. A host that goes
// silent for its Liveness loses its lanes here too (they are killed: fencing).
// docs/remote.md has the deployment, TLS and the guarantees.
func ServeNode(ctx context.Context, cfg NodeConfig) error {
	bad := func(msg string) error { return &Error{Code: CodeInvalidArgument, Lane: -1, Message: msg} }
	switch {
	case lifecycle.IsLane():
		return bad("ServeNode called inside a knit lane process (call knit.Main first in main)")
	case ctx == nil:
		return bad("ServeNode: nil context")
	case cfg.Addr == "":
		return bad("NodeConfig.Addr: empty")
	case cfg.MaxLanes < 0 || cfg.MaxLanes > maxNodeLanes:
		return bad(fmt.Sprintf("NodeConfig.MaxLanes %d: want 0 to %d (0: %d)", cfg.MaxLanes, maxNodeLanes, defaultNodeLanes))
	}
	if cfg.MaxLanes == 0 {
		cfg.MaxLanes = defaultNodeLanes
	}
	// The node's settings, checked as a pool's would be.
	if err := cfg.poolConfig(&remote.Open{Lanes: 1}).check(); err != nil {
		return err
	}
	n := &node{cfg: cfg, root: logging.New(cfg.Logger, logging.DebugFromEnv()).With(zap.String("node", cfg.Addr))}
	a, err := remote.StartAgent(remote.AgentConfig{Listen: cfg.Addr, TLS: cfg.TLS, Log: n.root.Named(logging.Remote),
		NewSession: n.session, MaxLanes: cfg.MaxLanes})
	if err != nil {
		return &Error{Code: CodePoolUnavailable, Lane: -1, Message: "ServeNode", Cause: err}
	}
	host, _, _ := net.SplitHostPort(cfg.Addr)
	addr := net.JoinHostPort(host, strconv.Itoa(a.Port()))
	n.root.Info("node serving", zap.String("addr", addr), zap.Bool("tls", cfg.TLS != nil), zap.Int("max_lanes", cfg.MaxLanes))
	if cfg.Ready != nil {
		cfg.Ready(addr)
	}
	<-ctx.Done()
	a.Close()
	n.root.Info("node stopped", zap.String("addr", addr))
	return nil
}

// node is a running ServeNode.
type node struct {
	cfg  NodeConfig
	root *zap.Logger
}

// poolConfig is the Config of the node's pool for one host session.
func (c NodeConfig) poolConfig(o *remote.Open) Config {
	cfg := Config{
		Lanes: int(o.Lanes), Runtime: Process, Steal: StealOff,
		// The host keeps at most a window of calls on the lane (remote.Window): its
		// backlog here never fills.
		Backlog:        2 * remote.Window,
		StopAckTimeout: c.StopAckTimeout, KillGrace: c.KillGrace, StartupTimeout: c.StartupTimeout,
		Liveness: c.Liveness, LaneSpin: cmp.Or(c.LaneSpin, -1), CallerSpin: c.CallerSpin,
		// A host lane's calls run on its node lane, in order: the host decides where calls
		// go, and the lane's end report (which calls had started) relies on that order.
		MoveQueuedAfter:  -1,
		Payload:          Payload{Inline: int(o.Inline), Arena: int(o.Arena), MaxCall: int(o.MaxCall)},
		PanicCrashesLane: o.Flags&remote.OpenPanicCrash != 0,
		Process:          c.Process, Logger: c.Logger, node: true,
	}
	if c.LaneSpin == 0 {
		cfg.spinOne = nodeSpinOne
	}
	cfg.Process.MaxLaneMemory = 0 // the host recycles its lanes, not the node
	if o.Flags&remote.OpenCarry != 0 {
		// Inputs open with the host's carried context fields: the lanes must read them.
		cfg.Propagator = propagation.NewCompositeTextMapPropagator()
	}
	return cfg
}

// session checks a host's handshake — its tasks against this binary's, its settings
// against the node's bounds — and starts the pool that runs its lanes here.
func (n *node) session(o *remote.Open) (remote.LaneHost, error) {
	var wrong []string
	raws := map[uint32]*rawDef{}
	defs := make([]Definition, 0, len(o.Tasks))
	for _, t := range o.Tasks {
		d, ok := actors.Lookup(t.Name)
		switch {
		case !ok:
			wrong = append(wrong, fmt.Sprintf("task %q is not defined in the node's binary", t.Name))
			continue
		case d.Fingerprint() != t.Fingerprint:
			wrong = append(wrong, fmt.Sprintf("task %q has other types on the node (fingerprint %x, the host's %x)", t.Name, d.Fingerprint(), t.Fingerprint))
			continue
		case raws[t.Index] != nil:
			wrong = append(wrong, fmt.Sprintf("function index %d names two tasks", t.Index))
			continue
		}
		rd := &rawDef{real: d}
		raws[t.Index] = rd
		defs = append(defs, rd)
	}
	for _, rd := range raws { // a task's calls pack into chunks of its twin (packable)
		if t, ok := rd.real.(interface{ Twin() actors.Def }); ok {
			for _, tw := range raws {
				if tw.real == t.Twin() {
					rd.twin, tw.of = tw, rd
				}
			}
		}
	}
	switch {
	case len(wrong) > 0:
		return nil, fmt.Errorf("the node's binary does not match the host's: %s", strings.Join(wrong, "; "))
	case len(defs) == 0:
		return nil, errors.New("the host sent no tasks")
	case o.Lanes == 0 || o.Lanes > maxLanes:
		return nil, fmt.Errorf("a pool of %d lanes", o.Lanes)
	case o.Arena > maxNodeArena:
		return nil, fmt.Errorf("an arena of %d bytes per lane: the node maps at most %d", o.Arena, maxNodeArena)
	case o.MaxCall == 0 || o.MaxCall > remote.MaxPayload:
		return nil, fmt.Errorf("a call limit of %d bytes", o.MaxCall)
	}
	cfg := n.cfg.poolConfig(o)
	cfg.Name = "knit-node-" + o.Reply
	p, err := newPool(cfg, defs...)
	if err != nil {
		if p != nil {
			_ = p.Close(context.Background())
		}
		return nil, err
	}
	return &nodeHost{n: n, p: p, raws: raws, lanes: map[*nodeLane]struct{}{},
		noPack: cfg.PanicCrashesLane || cfg.Propagator != nil, maxCall: int(o.MaxCall), packBelow: packBelow}, nil
}

// nodeSpinOne is how long a node's lane whose calls come one at a time polls for the next,
// by default (NodeConfig.LaneSpin).
const nodeSpinOne = time.Millisecond

// startNode finishes a node pool's start (newPool): it observes, keeps spares and watches
// its lanes; the host starts them.
func (p *Pool) startNode() error {
	if err := p.startObserving(); err != nil {
		_ = p.closeLimits()
		return err
	}
	p.up.Store(true) // starts take spares
	p.spares.Refill()
	if p.cfg.Liveness > 0 {
		p.stopWatch, p.watchDone = make(chan struct{}), make(chan struct{})
		go p.watchdog(p.stopWatch, p.watchDone)
	}
	return nil
}

// nodeHost runs one host session's lanes: a pool of process lanes with no supervision tree
// (the host's supervisor decides every lane's fate) whose calls are the host's, carried as
// bytes (rawDef).
type nodeHost struct {
	n    *node
	p    *Pool
	raws map[uint32]*rawDef // by the host's function index
	// Packing (packable): a session whose panics crash lanes, or whose inputs open with
	// carried context fields, packs no call; a chunk's input is at most maxCall bytes.
	noPack    bool
	maxCall   int
	packBelow time.Duration // packBelow's, when the session began
	packs     atomic.Uint64 // chunks of calls packed (logged when the session ends)
	awaited   atomic.Uint64 // calls the agent awaited until answered (awaitOne; logged too)

	mu       sync.Mutex
	lanes    map[*nodeLane]struct{}
	closed   bool
	starting sync.WaitGroup
}

// StartLane implements remote.LaneHost.
func (h *nodeHost) StartLane(idx, inc int, out remote.LaneOut) (remote.NodeLane, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, errors.New("the host's session is ending")
	}
	h.starting.Add(1)
	h.mu.Unlock()
	defer h.starting.Done()
	if idx < 0 || idx >= maxLanes {
		return nil, fmt.Errorf("lane %d of a pool of at most %d", idx, maxLanes)
	}
	for { // the host's pool may have grown (Resize) since the session began
		n := h.p.size.Load()
		if int(n) > idx || h.p.size.CompareAndSwap(n, int32(idx+1)) {
			break
		}
	}
	w, err := host{h.p}.StartLane(idx, inc)
	if err != nil {
		return nil, fmt.Errorf("%v", errorOf(err))
	}
	l := w.(*lane)
	nl := &nodeLane{h: h, l: l, out: out, bySeq: map[uint64]*rawRec{}, reported: make(chan struct{})}
	// The results of a drained batch leave together, from the drainer.
	l.afterDrain = out.Flush
	l.needReaper() // the host waits for every result: the reaper drains without a caller asking
	l.Open()
	h.mu.Lock()
	closed := h.closed
	if !closed {
		h.lanes[nl] = struct{}{}
	}
	h.mu.Unlock()
	if closed {
		l.Kill(lifecycle.Exit{})
		<-l.Ended()
		return nil, errors.New("the host's session is ending")
	}
	go nl.watch()
	return nl, nil
}

// Close implements remote.LaneHost: every lane is killed at once and its end reported, and
// the pool closes.
func (h *nodeHost) Close() {
	h.mu.Lock()
	h.closed = true
	lanes := make([]*nodeLane, 0, len(h.lanes))
	for nl := range h.lanes {
		lanes = append(lanes, nl)
	}
	h.mu.Unlock()
	h.starting.Wait()
	for _, nl := range lanes {
		nl.l.Kill(lifecycle.Exit{})
	}
	for _, nl := range lanes {
		<-nl.reported
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing is left to wait for
	_ = h.p.Close(ctx)
	h.n.root.Debug("host session ended", zap.String("pool", h.p.Name()), zap.Uint64("chunks_packed", h.packs.Load()),
		zap.Uint64("calls_awaited", h.awaited.Load()))
}

// A nodeLane is one of the host's lanes on this node: a process lane of the node's pool.
type nodeLane struct {
	h   *nodeHost
	l   *lane
	out remote.LaneOut

	mu       sync.Mutex
	bySeq    map[uint64]*rawRec // the calls it holds, by the host's sequence number
	ones     int                // frames of a single call in a row (Submit's, one goroutine)
	calls    []actors.Call      // Submit's scratch: a frame's calls, and their records
	recs     []*rawRec
	rs       []remote.Result // unpack's scratch (its lane's drainer: one at a time)
	done     uint64          // the highest host sequence number it answered
	started  uint64          // at its end: the highest one it had started
	busy     bool            // at its end: a call was running
	began    int             // at its end: of that call, if a Map chunk, the elements started; else -1
	reported chan struct{}
}

// neverDone gives every call an abort bit (a call with no Done channel gets none), which
// Cancel raises; it never closes, so no call leaves the backlog unanswered.
var neverDone = make(chan struct{})

// Submit implements remote.NodeLane: a frame's calls go to the lane's ring together, with
// one publication and at most one wake-up of the lane (actors.HostRing.SubmitBatch), and a
// run of quick calls of one task as one call of its twin (packable).
func (nl *nodeLane) Submit(cs []remote.Call) error {
	calls, recs := nl.calls[:0], nl.recs[:0]
	defer func() { // kept for the next frame, holding nothing of this one
		clear(calls)
		clear(recs)
		nl.calls, nl.recs = calls[:0], recs[:0]
	}()
	var now time.Time
	unknown := false
	for i := 0; i < len(cs); {
		c := &cs[i]
		rd := nl.h.raws[c.Fn]
		if rd == nil {
			// A function the handshake did not name: the call fails, the lane is sound.
			nl.out.Result(remote.Result{Seq: c.Seq, Outcome: uint32(actors.BadInput),
				Payload: actors.EncodeWireError(nil, actors.CodeUnsupportedType, fmt.Sprintf("function %d is not served here", c.Fn))})
			unknown = true
			i++
			continue
		}
		if k := nl.h.packable(cs[i:]); k > 1 {
			r := rd.twin.alloc(nl, c.Seq)
			r.packed(cs[i : i+k])
			nl.h.packs.Add(1)
			calls = append(calls, actors.Call{Def: rd.twin, ID: r.id, Gen: r.gen.Load(), Lane: &r.lane, Abort: &r.abort,
				Seq: &r.seq, Payload: r.packIn, Done: neverDone})
			recs = append(recs, r)
			i += k
			continue
		}
		i++
		r := rd.alloc(nl, c.Seq)
		call := actors.Call{Def: rd, ID: r.id, Gen: r.gen.Load(), Lane: &r.lane, Abort: &r.abort, Seq: &r.seq,
			Payload: c.Payload, Done: neverDone}
		if c.Timeout != 0 && now.IsZero() {
			now = time.Now()
		}
		switch {
		case c.Timeout > 0:
			call.Deadline = now.Add(c.Timeout).UnixNano()
		case c.Timeout < 0: // none left: the task starts with its context ended
			call.Deadline = now.UnixNano()
		}
		calls, recs = append(calls, call), append(recs, r)
	}
	if unknown {
		nl.out.Flush()
	}
	if len(calls) == 0 {
		return nil
	}
	nl.hold(recs)
	if len(cs) == 1 {
		nl.ones++
	} else {
		nl.ones = 0
	}
	// A lane that polls for its calls, one at a time, answers a quick one within
	// microseconds: its result is awaited here (awaitOne), the reaper idle meanwhile
	// (lane.agentDrains). Otherwise the reaper is rung to linger for the results while the
	// lane wakes and runs them.
	await := nl.ones > actors.OneAtATime && len(calls) == 1 && nl.l.polling()
	if await {
		nl.l.agentDrains.Store(true)
	}
	taken, err := nl.l.ring.SubmitBatch(calls)
	stamp.S(stamp.NodeSubmitted)
	nl.untaken(recs[taken:])
	if await && taken == 1 && !nl.l.rang.Load() && nl.awaitOne(recs[0]) {
		nl.h.awaited.Add(1)
	} else {
		nl.reaperDrains()
		if taken > 0 {
			nl.l.expectResults()
		}
	}
	for _, r := range recs[:taken] {
		if hard := r.def.real.Options().HardTimeout; hard > 0 {
			nl.watchHard(r.def, r, r.gen.Load(), hard)
		}
	}
	return err
}

// hold notes the calls of recs as the lane's, by their host sequence numbers.
func (nl *nodeLane) hold(recs []*rawRec) {
	nl.mu.Lock()
	defer nl.mu.Unlock()
	for _, r := range recs {
		if r.pack == nil {
			nl.bySeq[r.hostSeq] = r
		}
		for _, seq := range r.pack {
			nl.bySeq[seq] = r
		}
	}
}

// untaken lets go of calls the lane's ring did not take: the lane has ended (its report
// says these had not started), or, which the node's backlog (two windows) rules out, it is
// full.
func (nl *nodeLane) untaken(recs []*rawRec) {
	if len(recs) == 0 {
		return
	}
	nl.mu.Lock()
	for _, r := range recs {
		delete(nl.bySeq, r.hostSeq)
		for _, seq := range r.pack {
			delete(nl.bySeq, seq)
		}
	}
	nl.mu.Unlock()
	for _, r := range recs {
		r.def.release(r)
	}
}

// Packing: a node's lane runs a host's calls one slot each, and a slot costs the lane and
// the node's agent about as much as a quick task's run. So a run of calls of one task in a
// frame, each quick (the task's pace, as the lane times it, at most packBelow), goes to the
// lane as one call of the task's twin (a chunk, as Map's), which runs them one after the
// other; its result splits into theirs here. What that changes for them:
//   - their results leave together, once the last has run: a call waits for the ones packed
//     before it (at most maxPack × packBelow, at the pace last seen);
//   - when the lane dies running the chunk, the calls of it that had finished are in doubt
//     with the one it was running (their results died with it), where alone they would have
//     been answered;
//   - an element the chunk did not start (its result would have grown past half the call
//     limit) runs again alone on the lane, after calls sent later.
//
// Only calls that nothing can interrupt pack: no deadline, no Cancel (remote.Call.NoCancel),
// no HardTimeout (a chunk's is its own); and none in a session whose panics crash lanes (a
// panic would take its finished neighbours' results along) or whose inputs carry context
// fields (a chunk's input has one set).
const maxPack = 64

// packBelow is the longest a task's calls may run to pack (a var: the tests' nodes pack
// at any pace).
var packBelow = 10 * time.Microsecond

// packable is how many of cs, from the first, may run as one chunk (0 or 1: the first runs
// alone).
func (h *nodeHost) packable(cs []remote.Call) int {
	rd := h.raws[cs[0].Fn]
	if rd.twin == nil || h.noPack || rd.real.Options().HardTimeout > 0 {
		return 0
	}
	if pace := rd.pace.Load(); pace == 0 || pace > int64(h.packBelow) {
		return 0 // unknown yet (the first calls run alone and tell), or slow
	}
	size, k := 4, 0 // the count, then each input with its length (actors.chunkIn)
	for k < min(len(cs), maxPack) {
		c := &cs[k]
		if c.Fn != cs[0].Fn || c.Timeout != 0 || !c.NoCancel || size+4+len(c.Payload) > h.maxCall {
			break
		}
		size += 4 + len(c.Payload)
		k++
	}
	return k
}

// packed makes r the chunk of calls cs: their sequence numbers, and the twin's input.
func (r *rawRec) packed(cs []remote.Call) {
	size := 4
	for i := range cs {
		size += 4 + len(cs[i].Payload)
	}
	in := make([]byte, 0, size) // the ring's backlog may keep it: never reused
	in = binary.LittleEndian.AppendUint32(in, uint32(len(cs)))
	r.pack = make([]uint64, len(cs))
	for i := range cs {
		r.pack[i] = cs[i].Seq
		in = binary.LittleEndian.AppendUint32(in, uint32(len(cs[i].Payload)))
		in = append(in, cs[i].Payload...)
	}
	r.packIn = in
}

// unpack hands the host the results of a chunk of calls (pack, packIn, of task rd) that
// the lane answered with outcome o and payload: a chunk's result (actors.ChunkResults)
// when o is OK. An element the chunk did not start runs again alone.
func (nl *nodeLane) unpack(rd *rawDef, pack []uint64, packIn []byte, o actors.Outcome, ran uint64, payload []byte) {
	per := ran / uint64(len(pack))
	rd.notePace(per)
	var again []int
	switch {
	case o > actors.BadOutput: // the lane wrote it: no outcome a chunk answers with
		nl.failPack(pack, fmt.Sprintf("a chunk answered with outcome %d", o))
	case o == actors.OK:
		n, entries := actors.ChunkResults(payload)
		if n != len(pack) {
			nl.failPack(pack, fmt.Sprintf("a chunk of %d calls answered with %d results", len(pack), n))
			return
		}
		// The results go together (one lock each side, not one per call), once all decoded.
		rs, i, why := nl.rs[:0], 0, ""
		for e, err := range entries {
			if err != nil {
				why = "the chunk's result did not decode: " + err.Error()
				break
			}
			if e.Outcome > actors.BadOutput {
				why = fmt.Sprintf("element %d of the chunk answered with outcome %d", i, e.Outcome)
				break
			}
			if e.Outcome == actors.Stale {
				again = append(again, i)
			} else {
				rs = append(rs, remote.Result{Seq: pack[i], Outcome: uint32(e.Outcome), Ran: per, Payload: e.Payload()})
			}
			i++
		}
		nl.results(rs)
		clear(rs) // the payloads are the ring's
		nl.rs = rs[:0]
		if why != "" { // with the elements left to run again: the chunk is not to be trusted
			var fail []uint64
			for _, k := range again {
				fail = append(fail, pack[k])
			}
			nl.failPack(append(fail, pack[i:]...), why)
			return
		}
	case o == actors.Stale: // none started
		for i := range pack {
			again = append(again, i)
		}
	default: // the chunk failed as a whole: each call with its error
		for _, seq := range pack {
			nl.result(seq, o, per, payload)
		}
	}
	if len(again) > 0 {
		nl.runAlone(rd, pack, packIn, again)
	}
}

// failPack fails calls of a chunk whose result broke its framing (the lane process wrote it).
func (nl *nodeLane) failPack(seqs []uint64, why string) {
	nl.h.n.root.Warn("a lane broke the chunk protocol", zap.Int32("lane_key", nl.l.key), zap.String("error", why))
	for _, seq := range seqs {
		nl.result(seq, actors.BadOutput, 0, actors.EncodeWireError(nil, string(CodeWorkerCrashed), why))
	}
}

// runAlone submits elements idx of a chunk again, each a call of its own, from a goroutine
// of its own: the drainer that settled the chunk must not wait for the ring's submitters.
func (nl *nodeLane) runAlone(rd *rawDef, pack []uint64, packIn []byte, idx []int) {
	ins := make([][]byte, len(pack))
	b := packIn[4:]
	for i := range ins { // framed by packed
		n := binary.LittleEndian.Uint32(b)
		ins[i], b = b[4:4+n], b[4+n:]
	}
	calls, recs := make([]actors.Call, len(idx)), make([]*rawRec, len(idx))
	for j, i := range idx {
		r := rd.alloc(nl, pack[i])
		recs[j] = r
		calls[j] = actors.Call{Def: rd, ID: r.id, Gen: r.gen.Load(), Lane: &r.lane, Abort: &r.abort, Seq: &r.seq,
			Payload: ins[i], Done: neverDone}
	}
	nl.hold(recs)
	go func() {
		taken, _ := nl.l.ring.SubmitBatch(calls)
		if taken > 0 {
			nl.l.expectResults()
		}
		nl.untaken(recs[taken:])
	}()
}

// watchHard kills the lane once call r has run on it for its task's HardTimeout, measured
// from when the lane started it, as a pool's own hard timeouts are (watchHard in call.go).
func (nl *nodeLane) watchHard(rd *rawDef, r *rawRec, gen uint32, hard time.Duration) {
	var look func()
	look = func() {
		if r.gen.Load() != gen || r.lane.Load() != nl.l.key {
			return // answered, or its lane has ended
		}
		word, ok := nl.l.running()
		seq := r.seq.Load()
		switch {
		case !ok:
			return
		case seq == 0 || fastpath.Started(word) < seq:
			time.AfterFunc(hard, look) // not started yet
			return
		case fastpath.Started(word) > seq || !fastpath.Busy(word):
			return // finished: its result is on the way
		}
		since, ok := nl.l.since()
		if !ok {
			return
		}
		if wait := time.Until(since.Add(hard)); wait > 0 {
			time.AfterFunc(wait, look)
			return
		}
		nl.l.Kill(lifecycle.Exit{HardTimeout: fmt.Sprintf("task %q overran %v", rd.Name(), hard)})
	}
	time.AfterFunc(hard, look)
}

// reaperDrains hands the lane's results back to its reaper after the agent awaited them.
func (nl *nodeLane) reaperDrains() {
	if nl.l.agentDrains.Swap(false) {
		nl.l.kickReaper()
	}
}

// awaitOne drains the lane until call r is answered, for at most the pool's caller spin
// (CallerSpin), as a local caller of a polling lane does: its result then leaves from
// here, not after the reaper's wake-up through the eventfd and the netpoller, which costs
// tens of microseconds. It reports whether r was answered; if not, the reaper takes over.
func (nl *nodeLane) awaitOne(r *rawRec) bool {
	key, budget := nl.l.key, nl.h.p.cfg.CallerSpin
	if budget <= 0 {
		return false
	}
	start := fastpath.Now()
	for i := 1; r.lane.Load() == key; i++ { // released once answered (or its lane ended)
		nl.l.drain()
		spin.Pause()
		if i%64 == 0 && fastpath.Now()-start > budget {
			return r.lane.Load() != key
		}
	}
	return true
}

// Cancel implements remote.NodeLane: the call's abort bit is raised.
func (nl *nodeLane) Cancel(seq uint64) {
	nl.mu.Lock()
	r := nl.bySeq[seq]
	nl.mu.Unlock()
	if r != nil && r.pack == nil { // a chunk's calls are ones the host said no Cancel names
		nl.l.raiseAbort(r.abort.Load(), r.def.Index(), r.id)
	}
}

// Stop implements remote.NodeLane.
func (nl *nodeLane) Stop(kill bool, reason string) {
	if kill {
		nl.l.Debug("killed at the host's request", zap.String("reason", reason))
		nl.l.Kill(lifecycle.Exit{})
		return
	}
	go nl.l.Stop()
}

// PID implements remote.NodeLane.
func (nl *nodeLane) PID() int { return nl.l.PID() }

// results is result for each of rs, in order.
func (nl *nodeLane) results(rs []remote.Result) {
	nl.mu.Lock()
	for i := range rs {
		delete(nl.bySeq, rs[i].Seq)
		nl.done = max(nl.done, rs[i].Seq)
	}
	nl.mu.Unlock()
	nl.out.Results(rs)
}

// result hands the host a call's result (its payload in shared memory: Result copies it).
func (nl *nodeLane) result(seq uint64, o actors.Outcome, ran uint64, payload []byte) {
	nl.mu.Lock()
	delete(nl.bySeq, seq)
	nl.done = max(nl.done, seq)
	nl.mu.Unlock()
	nl.out.Result(remote.Result{Seq: seq, Outcome: uint32(o), Ran: ran, Payload: payload})
}

// lost notes a call the lane held when it ended; began is, for a Map chunk it had started,
// how many of its elements had (-1: not known, or not a chunk).
func (nl *nodeLane) lost(seq uint64, started bool, began int) {
	nl.mu.Lock()
	delete(nl.bySeq, seq)
	if started && seq >= nl.started {
		nl.started, nl.busy, nl.began = seq, true, began
	}
	nl.mu.Unlock()
}

// watch reports the lane's end once its calls are settled: how it ended, and which of the
// host's calls had started (every one up to Started had: the lane runs them in order).
func (nl *nodeLane) watch() {
	defer close(nl.reported)
	<-nl.l.Ended()
	e, normal := nl.l.Outcome()
	nl.mu.Lock()
	end := remote.Ended{Code: string(e.Code), Message: e.Message, Normal: normal,
		Started: max(nl.started, nl.done), Busy: nl.busy, Began: -1}
	if nl.busy && nl.started > nl.done {
		end.Began = nl.began
	}
	nl.mu.Unlock()
	var rep *lifecycle.LaneReport
	if errors.As(e.Cause, &rep) {
		if rep.Failure != "" {
			end.Stack = append(end.Stack, rep.Failure)
		}
		end.Stack, end.Tail = append(end.Stack, rep.Stack...), rep.Tail
	}
	nl.h.mu.Lock()
	delete(nl.h.lanes, nl)
	nl.h.mu.Unlock()
	nl.out.Ended(&end)
}

// rawDef is a host's task on a node: its calls come and go as the host's encoded bytes,
// which the lane process decodes and encodes with the task's own codecs (it looks the task
// up by name, as any lane does); the node never decodes a value. It stands in for the task
// in the node's pool (an actors.Def, and a Definition for NewPool) and keeps the calls'
// records, which tell each result and each lane end which host call it was.
type rawDef struct {
	real actors.Def
	twin *rawDef // its twin, which carries packed calls (nil: none served)
	of   *rawDef // a twin's: the task it packs calls of
	// pace is how long its calls run, in nanoseconds (0: not known yet), as the lane times
	// them (a chunk: its run over its elements): packable reads it.
	pace atomic.Int64

	mu   sync.Mutex
	recs []*rawRec
	free []uint32
}

type rawRec struct {
	def     *rawDef
	id      uint32
	gen     atomic.Uint32
	lane    atomic.Int32 // the lane holding the call (its key), -1: none
	abort   atomic.Int32
	seq     atomic.Uint64 // its sequence number on the node's lane
	owner   *nodeLane
	hostSeq uint64
	// A chunk of calls (packable): their host sequence numbers (hostSeq is the first's),
	// and the twin's input, their inputs.
	pack   []uint64
	packIn []byte
}

func (d *rawDef) actorsDef() actors.Def { return d }

func (d *rawDef) alloc(owner *nodeLane, hostSeq uint64) *rawRec {
	d.mu.Lock()
	defer d.mu.Unlock()
	var r *rawRec
	if n := len(d.free); n > 0 {
		r = d.recs[d.free[n-1]]
		d.free = d.free[:n-1]
	} else {
		r = &rawRec{def: d, id: uint32(len(d.recs))}
		d.recs = append(d.recs, r)
	}
	r.gen.Add(1)
	r.lane.Store(-1)
	r.abort.Store(-1)
	r.seq.Store(0)
	r.owner, r.hostSeq, r.pack, r.packIn = owner, hostSeq, nil, nil
	return r
}

// notePace adds a call that ran ran nanoseconds (0: not timed) to the task's pace: half
// way to it, so that a task that turns slow stops packing within a chunk or two.
func (d *rawDef) notePace(ran uint64) {
	if ran == 0 {
		return
	}
	v := int64(min(ran, uint64(time.Second)))
	if old := d.pace.Load(); old != 0 {
		v = old + (v-old)/2
	}
	d.pace.Store(v)
}

func (d *rawDef) release(r *rawRec) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r.lane.Store(-1)
	r.owner = nil
	d.free = append(d.free, r.id)
}

// held is record id of generation gen, if lane holds it.
func (d *rawDef) held(lane int32, id, gen uint32) *rawRec {
	d.mu.Lock()
	defer d.mu.Unlock()
	if int(id) >= len(d.recs) {
		return nil
	}
	if r := d.recs[id]; r.gen.Load() == gen && r.lane.Load() == lane && r.owner != nil {
		return r
	}
	return nil
}

func (d *rawDef) Name() string             { return d.real.Name() }
func (d *rawDef) Index() uint32            { return d.real.Index() }
func (d *rawDef) Fingerprint() uint64      { return d.real.Fingerprint() }
func (d *rawDef) Options() *actors.Options { return d.real.Options() }
func (d *rawDef) Codecs() (in, out string) { return "bytes (the host's)", "bytes (the host's)" }

// RunLocal, RunEncoded and PanicOf are never called: a node's lanes are processes, which run
// the task itself.
func (d *rawDef) RunLocal(uint32, uint32) actors.Outcome { return actors.Stale }
func (d *rawDef) RunEncoded(_ context.Context, _ []byte, dst []byte) ([]byte, actors.Outcome) {
	return actors.EncodeWireError(dst, actors.CodeUnsupportedType, "not run on the node's host side"), actors.BadInput
}
func (d *rawDef) PanicOf(uint32) error { return errors.New("no panic on the node's host side") }

// SettleResult implements actors.Def: the result goes to the host as it is.
func (d *rawDef) SettleResult(_ uint64, lane int32, id, gen uint32, o actors.Outcome, payload []byte, _ bool, ran uint64, _ actors.Wrapper) error {
	r := d.held(lane, id, gen)
	if r == nil {
		return fmt.Errorf("result for call %d/%d of task %q, which this lane does not hold", id, gen, d.Name())
	}
	nl, seq, pack, packIn := r.owner, r.hostSeq, r.pack, r.packIn
	d.release(r)
	if pack != nil {
		nl.unpack(d.of, pack, packIn, o, ran, payload)
		return nil
	}
	d.notePace(ran)
	nl.result(seq, o, ran, payload)
	return nil
}

// FailLane implements actors.Def: each call the ended lane held is noted, started or not,
// for its end report; none runs again here (the host decides).
func (d *rawDef) FailLane(e actors.LaneEnd) int {
	d.mu.Lock()
	var held []*rawRec
	for _, r := range d.recs {
		if r.owner != nil && r.lane.Load() == e.Lane {
			held = append(held, r)
		}
	}
	d.mu.Unlock()
	for _, r := range held {
		seq := r.seq.Load()
		nl, hostSeq, pack := r.owner, r.hostSeq, r.pack
		d.release(r)
		started := seq != 0 && seq <= e.Started
		if pack == nil {
			nl.lost(hostSeq, started, chunkBegan(e.Chunk, seq))
			continue
		}
		// A chunk of calls: those it had started, by its chunk word, if it was running
		// (else none, or, when it had finished, every one: their results died with it).
		began := 0
		if started {
			if began = chunkBegan(e.Chunk, seq); began < 0 || seq < e.Started {
				began = len(pack)
			}
		}
		for i, hs := range pack {
			nl.lost(hs, i < began, -1)
		}
	}
	return len(held)
}

// chunkBegan reads the chunk word a node's lane process left for its call seq: how many
// elements of that Map chunk had started, -1 when the word is another call's. The lane
// wrote it: a count over a chunk's most elements is cut to it, so that the host, which
// refuses such an end report (remote.Ended), hears how the lane ended all the same.
func chunkBegan(word, seq uint64) int {
	began, ok := fastpath.ChunkStarted(word, seq)
	if !ok {
		return -1
	}
	return min(began, actors.MaxChunk)
}

// Withdraw implements actors.Def. A node's pool moves no call (its MoveQueuedAfter is off:
// a host lane's calls run on its node lane, in order, which its end report relies on), so
// nothing calls it; should something, each call taken back fails to its host at once, so
// that none is stranded.
func (d *rawDef) Withdraw(e actors.LaneEnd) int {
	d.mu.Lock()
	var taken []*rawRec
	for _, r := range d.recs {
		if seq := r.seq.Load(); r.owner != nil && r.lane.Load() == e.Lane && (seq == 0 || seq > e.Started) {
			taken = append(taken, r)
		}
	}
	d.mu.Unlock()
	for _, r := range taken {
		nl, seqs := r.owner, r.pack
		if seqs == nil {
			seqs = []uint64{r.hostSeq}
		}
		d.release(r)
		for _, hs := range seqs {
			nl.result(hs, actors.Failed, 0, actors.EncodeWireError(nil, string(CodeWorkerCrashed),
				"the node's pool took the call back from its lane (a bug of knit's: node pools move no call)"))
		}
	}
	return len(taken)
}

// Drop implements actors.Def (never called: no call's Done ever closes).
func (d *rawDef) Drop(lane int32, id, gen uint32) bool {
	if r := d.held(lane, id, gen); r != nil {
		d.release(r)
		return true
	}
	return false
}
