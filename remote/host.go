package remote

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/internal/stamp"
	"github.com/knitgo/knit/lifecycle"
)

// The host side: Nodes is the lifecycle.Runtime of a pool whose lanes run on other machines.
// Each incarnation is a region in the host's heap, like a goroutine lane's, whose far end —
// the consumer of its request ring and the producer of its return ring — is a forwarder
// goroutine of the host instead of an executor: it takes the calls the pool publishes,
// sends them to the lane's node in one frame per batch, and publishes the results the node
// streams back. To the pool it is a lane like a process lane: encoded payloads, a reaper,
// abort bits, a stop protocol, a classified end with precise settlement.

// Actor names: a node's agent, and a host pool's receiving actor. Both are spawned by their
// own side; nothing is ever spawned remotely.
const (
	AgentName = "knit-node"
	HostName  = "knit-host"
)

// HostConfig configures the lanes a pool places on nodes.
type HostConfig struct {
	Nodes []string    // host:port of each node's agent
	TLS   *tls.Config // nil: plaintext
	// Listen is where the pool's own endpoint listens for the nodes' frames (default
	// ":0"); Advertise the host name or IP nodes reach it at (default: for each node, the
	// local address this host reaches it from).
	Listen, Advertise string
	Lanes             int
	MaxCall           int // Payload.MaxCall
	// Liveness bounds how long a lost node goes unnoticed (the heartbeat runs every
	// Liveness/4); StartupTimeout a lane's start, connection included.
	Liveness, StartupTimeout time.Duration
	Layout                   fastpath.Layout
	Epoch                    int64
	Tasks                    []TaskRef
	Flags                    uint32 // OpenCarry, OpenPanicCrash
	Log                      *zap.Logger
	// Move asks for lane's incarnation inc to be replaced gracefully (a recycle): its home
	// node is back and it serves elsewhere.
	Move func(lane, inc int, reason string)
}

// Nodes is the runtime of a pool's remote lanes.
type Nodes struct {
	cfg   HostConfig
	ep    *Member
	links []*link
	log   *zap.Logger

	mu       sync.RWMutex
	incs     map[incKey]*incarnation // by session, lane and incarnation: where frames go
	sessions map[Session]*link
	current  []*incarnation // by lane: its latest incarnation
	closed   bool

	stop chan struct{}
	wg   sync.WaitGroup

	missed atomic.Uint64 // wakes the forwarders lost, caught by the heartbeat (checkStalled)
	widest atomic.Int64  // the most calls a forward has sent at once (Widest)
}

// Missed is how many times a lane's forwarder slept through calls it could send until the
// heartbeat woke it: a lost wake, which the doorbell protocol should never have. Tests
// assert it stays 0.
func (n *Nodes) Missed() uint64 { return n.missed.Load() }

// Widest is the most calls one forward has sent (in one frame, unless it passed
// FrameTarget): more than a ring's 32 once a forwarder refills its ring from the lane's
// backlog as it goes. Tests assert it.
func (n *Nodes) Widest() int64 { return n.widest.Load() }

type incKey struct {
	s         Session
	lane, inc uint32
}

// NewNodes starts a pool's endpoint and the heartbeat of each node. It connects to none yet:
// the first lane placed on a node does.
func NewNodes(cfg HostConfig) (*Nodes, error) {
	if len(cfg.Nodes) == 0 {
		return nil, errors.New("no nodes")
	}
	if cfg.Listen == "" {
		cfg.Listen = ":0"
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	n := &Nodes{cfg: cfg, log: cfg.Log, incs: map[incKey]*incarnation{}, sessions: map[Session]*link{},
		current: make([]*incarnation, cfg.Lanes), stop: make(chan struct{})}
	seen := map[string]bool{}
	for i, addr := range cfg.Nodes {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("node %q: %w", addr, err)
		}
		if seen[addr] {
			return nil, fmt.Errorf("node %q is listed twice", addr)
		}
		seen[addr] = true
		n.links = append(n.links, &link{n: n, idx: i, addr: addr, changed: make(chan struct{}), kick: make(chan struct{}, 1)})
	}
	ep, err := Join(EndpointConfig{Listen: cfg.Listen, TLS: cfg.TLS, OnFrame: n.onFrame, OnLost: n.onLost, Log: cfg.Log})
	if err != nil {
		return nil, err
	}
	n.ep = ep
	for _, k := range n.links {
		if k.reply, err = n.replyAddress(k.addr); err != nil {
			ep.Close()
			return nil, err
		}
		n.wg.Add(1)
		go k.run()
	}
	return n, nil
}

// replyAddress is where node addr sends this pool's frames: Advertise, or the local address
// that routes to it, with the endpoint's port.
func (n *Nodes) replyAddress(addr string) (string, error) {
	host := n.cfg.Advertise
	if host == "" {
		c, err := net.Dial("udp", addr) // sends nothing: it only picks the route
		if err != nil {
			return "", fmt.Errorf("node %s: no route: %w", addr, err)
		}
		host = c.LocalAddr().(*net.UDPAddr).IP.String()
		c.Close()
	}
	return net.JoinHostPort(host, strconv.Itoa(n.ep.Port())), nil
}

// Caps implements lifecycle.Runtime: remote lanes take encoded payloads, have their results
// drained, are interrupted by abort bits and killed, not abandoned. They park (a network
// round trip dwarfs any spin), are watched by the nodes' heartbeat rather than the pool's
// watchdog, and take no process settings (their nodes have their own).
func (*Nodes) Caps() lifecycle.Caps { return lifecycle.Caps{Remote: true, Networked: true} }

// Close ends every link and the endpoint. The pool calls it once its lanes have stopped.
func (n *Nodes) Close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	close(n.stop)
	n.mu.Unlock()
	for _, k := range n.links {
		k.bye()
	}
	n.wg.Wait()
	n.ep.Close()
}

// NodeOf is the node of a lane's latest incarnation ("" before it has one).
func (n *Nodes) NodeOf(lane int) string {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if lane < 0 || lane >= len(n.current) || n.current[lane] == nil {
		return ""
	}
	return n.current[lane].k.addr
}

// Open implements lifecycle.Runtime: it places the incarnation (see place) and makes its
// region. Nothing is sent until Start.
func (n *Nodes) Open(idx, inc int) (lifecycle.Incarnation, error) {
	r, err := fastpath.NewRegion(shm.Heap(n.cfg.Layout.Size()), n.cfg.Layout, uint32(idx), uint32(inc), n.cfg.Epoch)
	if err != nil {
		return nil, err
	}
	c := &incarnation{n: n, idx: idx, inc: inc, region: r, laneBell: fastpath.NewChanBell(),
		doneBell: fastpath.NewChanBell(), dirBell: fastpath.NewChanBell(), ready: make(chan struct{}), kicked: make(chan struct{})}
	c.wake, c.req, c.ret, c.stats = r.LaneWake(), r.Requests().Consumer(), r.Returns().Producer(), r.Stats()
	c.aborts = r.Aborts()
	c.abortSeen.Store(r.AbortWake().Load())
	// Armed from the start: the pool's reaper sleeps on the doorbell until the lane is ready
	// (a ready lane signals it), instead of polling.
	r.Returns().Completion().Arm()
	n.mu.Lock()
	if idx >= len(n.current) {
		n.current = append(n.current, make([]*incarnation, idx+1-len(n.current))...)
	}
	c.k = n.place(idx)
	n.current[idx] = c
	n.mu.Unlock()
	return c, nil
}

// place picks a lane's node. Lane i's home is node i mod N, which spreads a pool's lanes
// evenly; a lane starts there unless the home node is known to be down, and then on the
// node that is up with the fewest of the pool's lanes (the first after the home one among
// equals). With no node up, it tries its home node, whose start fails with the reason.
// Called with n.mu held: lanes placed together (a group restarting) count each other.
func (n *Nodes) place(idx int) *link {
	home := n.links[idx%len(n.links)]
	if home.usable() {
		return home
	}
	var best *link
	bestLoad := 0
	for j := range n.links {
		k := n.links[(home.idx+j)%len(n.links)]
		if k.state() != linkUp {
			continue
		}
		load := 0
		for i, c := range n.current {
			if c != nil && c.k == k && i != idx {
				load++
			}
		}
		if best == nil || load < bestLoad {
			best, bestLoad = k, load
		}
	}
	if best == nil {
		return home
	}
	return best
}

// onFrame handles a frame from a node, on the endpoint's actor goroutine.
func (n *Nodes) onFrame(b []byte) {
	stamp.S(stamp.HostFrame)
	f, err := Parse(b)
	if err != nil {
		n.log.Debug("dropped a frame that does not parse", zap.Error(err))
		return
	}
	n.mu.RLock()
	k := n.sessions[f.Session]
	var c *incarnation
	if k != nil {
		c = n.incs[incKey{f.Session, f.Lane, f.Inc}]
	}
	n.mu.RUnlock()
	if k == nil {
		return // an old session's, late: its lanes have ended
	}
	k.heard.Store(time.Now().UnixNano())
	switch f.Kind {
	case KindPong:
		_, known, err := f.Pong()
		if err != nil {
			n.log.Debug("dropped a pong that does not decode", zap.Error(err))
			return
		}
		k.pong(f.Session, known)
	case KindResults:
		if c != nil {
			c.results(f)
		}
	case KindReady, KindFailed, KindEnded:
		if c != nil {
			c.post(f)
		}
	default:
		n.log.Debug("dropped a frame nodes do not send", zap.Stringer("kind", f.Kind))
	}
}

// onLost handles protoactor's report that a connection broke.
func (n *Nodes) onLost(address string) {
	for _, k := range n.links {
		if k.addr == address {
			k.lose("connection to the node lost")
		}
	}
}

func (n *Nodes) register(c *incarnation) {
	n.mu.Lock()
	n.incs[incKey{c.session, uint32(c.idx), uint32(c.inc)}] = c
	n.mu.Unlock()
}

func (n *Nodes) forget(c *incarnation) {
	n.mu.Lock()
	delete(n.incs, incKey{c.session, uint32(c.idx), uint32(c.inc)})
	n.mu.Unlock()
	c.k.remove(c)
}

// moveBack asks for the lanes whose home is k, and which serve elsewhere, to be moved home.
func (n *Nodes) moveBack(k *link) {
	if n.cfg.Move == nil {
		return
	}
	n.mu.RLock()
	var move []*incarnation
	for idx, c := range n.current {
		if c != nil && idx%len(n.links) == k.idx && c.k != k && c.isReady() {
			move = append(move, c)
		}
	}
	n.mu.RUnlock()
	for _, c := range move {
		n.cfg.Move(c.idx, c.inc, fmt.Sprintf("its home node %s is back (it serves on %s)", k.addr, c.k.addr))
	}
}

// Link states.
const (
	linkUnknown    = iota // never connected
	linkConnecting        // dialled, waiting for the first pong of a new session
	linkUp
	linkDown
)

// A link is the pool's connection to one node: its session, its heartbeat, and the
// incarnations placed on it.
type link struct {
	n     *Nodes
	idx   int
	addr  string
	reply string // where the node sends this pool's frames

	mu      sync.Mutex
	st      int
	session Session
	why     string                    // why it is down
	incs    map[*incarnation]struct{} // placed here, in the current session
	changed chan struct{}             // closed and replaced at every state change
	est     bool                      // a lane of the session has reported (Ready or Failed)
	tried   time.Time                 // the last connection attempt, and its error
	tryErr  error
	attempt *attempt // the connection attempt under way
	nonce   uint64

	heard atomic.Int64 // Unix ns of the last frame of the current session
	kick  chan struct{}
}

func (k *link) state() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.st
}

// usable: a lane may be placed here (it is up, or has never been tried).
func (k *link) usable() bool {
	s := k.state()
	return s == linkUp || s == linkUnknown || s == linkConnecting
}

func (k *link) setState(s int, why string) {
	k.st, k.why = s, why
	close(k.changed)
	k.changed = make(chan struct{})
}

// retryGap: a node that could not be reached is dialled again only this long after,
// whoever asks (the lanes of a pool restarting together share one attempt).
const retryGap = 100 * time.Millisecond

// connect brings the link up, if it is not: a dial check (for a clear error), then a new
// session whose first pong proves the node's agent answers. Callers share one attempt,
// which runs on its own (ctx only bounds the caller's wait), and a failed attempt is the
// answer for retryGap. It returns the session.
func (k *link) connect(ctx context.Context) (Session, error) {
	n := k.n
	n.mu.Lock() // before k.mu: place takes them in that order
	if n.closed {
		n.mu.Unlock()
		return Session{}, errors.New("the pool is closing")
	}
	n.wg.Add(1) // for an attempt this call may start
	n.mu.Unlock()
	started := false
	defer func() {
		if !started {
			n.wg.Done()
		}
	}()
	k.mu.Lock()
	if k.st == linkUp {
		s := k.session
		k.mu.Unlock()
		return s, nil
	}
	if k.tryErr != nil && time.Since(k.tried) < retryGap {
		err := k.tryErr
		k.mu.Unlock()
		return Session{}, err
	}
	att := k.attempt
	if att == nil {
		att = &attempt{done: make(chan struct{})}
		k.attempt, started = att, true
		go k.try(att)
	}
	k.mu.Unlock()
	select {
	case <-att.done:
		return att.s, att.err
	case <-ctx.Done():
		return Session{}, ctx.Err()
	}
}

// attempt is one connection attempt, which every caller of connect meanwhile waits for.
type attempt struct {
	done chan struct{}
	s    Session
	err  error
}

func (k *link) try(att *attempt) {
	defer k.n.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-k.n.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := k.n.ep.Check(ctx, k.addr)
	if err == nil {
		att.s, err = k.handshake(ctx)
	}
	att.err = err
	k.mu.Lock()
	k.tried, k.tryErr, k.attempt = time.Now(), err, nil
	if err != nil && k.st != linkUp {
		k.setState(linkDown, err.Error())
	}
	k.mu.Unlock()
	close(att.done)
}

// handshake starts a new session and waits for its first pong.
func (k *link) handshake(ctx context.Context) (Session, error) {
	var s Session
	_, _ = rand.Read(s[:])
	k.mu.Lock()
	k.session, k.est, k.incs = s, false, map[*incarnation]struct{}{}
	k.setState(linkConnecting, "")
	changed := k.changed
	k.mu.Unlock()
	k.n.mu.Lock()
	k.n.sessions[s] = k
	k.n.mu.Unlock()
	wait := k.n.cfg.Liveness
	t := time.NewTimer(wait)
	defer t.Stop()
	again := time.NewTicker(max(wait/4, time.Millisecond)) // a ping lost with a first connection
	defer again.Stop()
	k.ping(s)
	for {
		select {
		case <-again.C:
			k.ping(s)
		case <-changed:
			k.mu.Lock()
			st, cur := k.st, k.session
			changed = k.changed
			k.mu.Unlock()
			if cur != s {
				return Session{}, errors.New("superseded")
			}
			switch st {
			case linkUp:
				return s, nil
			case linkDown:
				return Session{}, errors.New(k.reason())
			}
		case <-t.C:
			k.lose(fmt.Sprintf("the node's agent did not answer within %v", wait))
			return Session{}, errors.New(k.reason())
		case <-ctx.Done():
			k.lose("connection attempt abandoned")
			return Session{}, ctx.Err()
		}
	}
}

func (k *link) reason() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.why
}

func (k *link) ping(s Session) {
	k.mu.Lock()
	k.nonce++
	nonce := k.nonce
	k.mu.Unlock()
	k.n.ep.Send(k.addr, AgentName, AppendPing(AppendHeader(nil, KindPing, s, 0, 0), nonce, k.reply, k.n.ep.Name()))
}

// pong notes a pong of session s: the first brings a connecting link up; a node that no
// longer knows an established session has dropped its lanes.
func (k *link) pong(s Session, known bool) {
	k.mu.Lock()
	if s != k.session {
		k.mu.Unlock()
		return
	}
	switch {
	case k.st == linkConnecting:
		k.setState(linkUp, "")
		k.mu.Unlock()
		k.n.log.Info("node up", zap.String("node", k.addr))
		k.n.moveBack(k)
		return
	case k.st == linkUp && !known && k.est:
		k.mu.Unlock()
		k.lose("the node dropped this host's lanes (it restarted, or fenced them)")
		return
	}
	k.mu.Unlock()
}

// lose marks the node lost, ends every incarnation on it (NODE_LOST) and tells the node,
// should it hear, to drop the session.
func (k *link) lose(why string) {
	k.mu.Lock()
	if k.st != linkUp && k.st != linkConnecting {
		k.mu.Unlock()
		return
	}
	old, incs := k.session, k.incs
	k.incs = map[*incarnation]struct{}{}
	k.setState(linkDown, why)
	k.mu.Unlock()
	k.n.mu.Lock()
	delete(k.n.sessions, old)
	k.n.mu.Unlock()
	k.n.log.Warn("node lost", zap.String("node", k.addr), zap.String("reason", why), zap.Int("lanes", len(incs)))
	for c := range incs {
		c.lost("node " + k.addr + " lost: " + why)
	}
	k.n.ep.Send(k.addr, AgentName, AppendHeader(nil, KindBye, old, 0, 0))
	k.poke()
}

// bye ends the link for good (the pool closes): the node drops the session at once rather
// than after its liveness timeout.
func (k *link) bye() {
	k.mu.Lock()
	s, st := k.session, k.st
	k.mu.Unlock()
	if st == linkUp || st == linkConnecting {
		k.n.ep.Send(k.addr, AgentName, AppendHeader(nil, KindBye, s, 0, 0))
	}
}

func (k *link) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// add places c on the link's current session; false when that session has ended since.
func (k *link) add(c *incarnation, s Session) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.session != s || k.st != linkUp {
		return false
	}
	k.incs[c] = struct{}{}
	return true
}

func (k *link) remove(c *incarnation) {
	k.mu.Lock()
	delete(k.incs, c)
	k.mu.Unlock()
}

// established notes that a lane of session s reported: from now on a pong that does not
// know the session means the node dropped it.
func (k *link) established(s Session) {
	k.mu.Lock()
	if k.session == s {
		k.est = true
	}
	k.mu.Unlock()
}

// run is the link's heartbeat: every Liveness/4 it pings an up node and declares it lost
// after Liveness without a frame; it probes a node that is down until it answers again,
// and then moves the lanes whose home it is back to it. It also looks at its lanes' abort
// bits, so that a cancelled call reaches its node even while its lane sleeps.
func (k *link) run() {
	defer k.n.wg.Done()
	live := k.n.cfg.Liveness
	tick := time.NewTicker(max(live/4, time.Millisecond))
	defer tick.Stop()
	probe := min(max(live/2, 100*time.Millisecond), 2*time.Second)
	var lastProbe time.Time
	for {
		select {
		case <-k.n.stop:
			return
		case <-tick.C:
		case <-k.kick:
		}
		k.mu.Lock()
		st, s := k.st, k.session
		incs := make([]*incarnation, 0, len(k.incs))
		for c := range k.incs {
			incs = append(incs, c)
		}
		k.mu.Unlock()
		switch st {
		case linkUp:
			if still := time.Since(time.Unix(0, k.heard.Load())); still > live {
				k.lose(fmt.Sprintf("no heartbeat for %v", still.Round(time.Millisecond)))
				continue
			}
			k.ping(s)
			for _, c := range incs {
				c.checkAborts()
				c.checkStalled()
			}
		case linkDown:
			if time.Since(lastProbe) < probe {
				continue
			}
			lastProbe = time.Now()
			_, _ = k.connect(context.Background()) // an attempt ends with Close
		}
	}
}
