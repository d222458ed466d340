package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/internal/stamp"
	"github.com/knitgo/knit/lifecycle"
)

// The node side: an Agent is the actor a node runs under the fixed name AgentName (spawned
// by the node itself: nothing is ever spawned remotely). It keeps one session per host pool
// that opened lanes here, hands each session's lanes to a LaneHost (the root's node-local
// pool of process lanes), streams their results back in batches, and fences a session whose
// host has gone silent for its liveness timeout: its lanes are killed, so that calls the
// host must count as in doubt stop as soon as they can.

// A LaneHost runs the lanes of one host session on this node.
type LaneHost interface {
	// StartLane starts lane idx's incarnation inc and returns once it serves, or why it
	// could not. Its results and its end go to out.
	StartLane(idx, inc int, out LaneOut) (NodeLane, error)
	// Close kills every lane at once (their ends are reported) and releases the host.
	Close()
}

// A NodeLane is one lane a LaneHost runs.
type NodeLane interface {
	// Submit queues a frame's calls, in order; those it cannot take once the lane has
	// ended are left (its end report covers them: they had not started), with the error.
	Submit(calls []Call) error
	// Cancel interrupts a call its caller gave up on.
	Cancel(seq uint64)
	// Stop stops the lane: once it has run what it holds, or at once (kill). Its end is
	// reported through LaneOut.
	Stop(kill bool, reason string)
	PID() int
}

// LaneOut is where a lane's results and end go. Result copies the payload before it
// returns and holds the result until Flush, which the lane calls once it has given what it
// has (a drained batch), so that a batch leaves in one frame without a hand-off to another
// goroutine; Ended is the lane's last report, and sends what Result holds before it.
type LaneOut interface {
	Result(r Result)
	// Results is Result for each of rs, in order, at the cost of one.
	Results(rs []Result)
	Flush()
	Ended(e *Ended)
}

// AgentConfig configures an Agent.
type AgentConfig struct {
	Listen string
	TLS    *tls.Config
	Log    *zap.Logger
	// NewSession makes the LaneHost of a host's first Open: it checks the handshake (the
	// tasks and their fingerprints, the settings) and fails with the reason the host gets.
	NewSession func(o *Open) (LaneHost, error)
	// MaxLanes bounds the lanes the node runs for all hosts together.
	MaxLanes int
}

// Agent is a node's agent.
type Agent struct {
	cfg AgentConfig
	ep  *Member
	log *zap.Logger

	mu       sync.Mutex
	sessions map[Session]*session
	lanes    int // started or starting, all sessions
	closed   bool
	wg       sync.WaitGroup
}

// StartAgent starts a node's agent listening on cfg.Listen.
func StartAgent(cfg AgentConfig) (*Agent, error) {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	a := &Agent{cfg: cfg, log: cfg.Log, sessions: map[Session]*session{}}
	ep, err := Join(EndpointConfig{Listen: cfg.Listen, TLS: cfg.TLS, Name: AgentName,
		OnFrame: a.onFrame, OnLost: a.onLost, Log: cfg.Log})
	if err != nil {
		return nil, err
	}
	a.ep = ep
	return a, nil
}

// Port is the port the agent listens on.
func (a *Agent) Port() int { return a.ep.Port() }

// Close fences every session (their lanes are killed) and stops the endpoint.
func (a *Agent) Close() {
	a.mu.Lock()
	a.closed = true
	ss := make([]*session, 0, len(a.sessions))
	for _, s := range a.sessions {
		ss = append(ss, s)
	}
	a.mu.Unlock()
	for _, s := range ss {
		s.fence("the node is shutting down")
	}
	a.wg.Wait()
	a.ep.Close()
}

// onFrame handles a frame from a host, on the endpoint's actor goroutine.
func (a *Agent) onFrame(b []byte) {
	stamp.S(stamp.NodeFrame)
	f, err := Parse(b)
	if err != nil {
		a.log.Debug("dropped a frame that does not parse", zap.Error(err))
		return
	}
	if f.Kind == KindOpen {
		a.open(f)
		return
	}
	a.mu.Lock()
	s := a.sessions[f.Session]
	a.mu.Unlock()
	if s != nil {
		s.heard.Store(time.Now().UnixNano())
	}
	switch f.Kind {
	case KindPing:
		nonce, reply, actor, err := f.Ping()
		if err != nil || !knitActor(actor) {
			a.log.Debug("dropped a ping that does not decode", zap.Error(err))
			return
		}
		a.ep.Send(reply, actor, AppendPong(AppendHeader(nil, KindPong, f.Session, 0, 0), nonce, s != nil && !s.isFenced()))
	case KindBye:
		if s != nil {
			s.fence("the host left")
		}
	case KindCalls, KindCancel, KindStop:
		if s != nil {
			s.lane(f)
		}
	default:
		a.log.Debug("dropped a frame hosts do not send", zap.Stringer("kind", f.Kind))
	}
}

// onLost fences the sessions of a host whose connection broke.
func (a *Agent) onLost(address string) {
	a.mu.Lock()
	var lost []*session
	for _, s := range a.sessions {
		if s.reply == address {
			lost = append(lost, s)
		}
	}
	a.mu.Unlock()
	for _, s := range lost {
		s.fence("connection to the host lost")
	}
}

// open starts a lane: the session is made on its first Open, and the lane starts on a
// goroutine of its own (a process start takes a while); Ready or Failed answers.
func (a *Agent) open(f Frame) {
	o, err := f.Open()
	if err != nil {
		a.log.Debug("dropped an open frame that does not decode", zap.Error(err))
		return // without a reply address there is nobody to answer
	}
	if !knitActor(o.ReplyActor) {
		a.log.Debug("dropped an open frame whose reply actor is no knit actor")
		return
	}
	fail := func(msg string) {
		a.ep.Send(o.Reply, o.ReplyActor, AppendFailed(AppendHeader(nil, KindFailed, f.Session, f.Lane, f.Inc),
			string(lifecycle.CodeStartupFailed), msg))
	}
	if o.Liveness <= 0 {
		fail("the host sent no liveness timeout")
		return
	}
	if f.Lane >= o.Lanes {
		fail(fmt.Sprintf("lane %d of a pool of %d", f.Lane, o.Lanes))
		return
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		fail("the node is shutting down")
		return
	}
	if a.lanes >= a.cfg.MaxLanes {
		a.mu.Unlock()
		fail(fmt.Sprintf("the node runs %d lanes already (its MaxLanes)", a.lanes))
		return
	}
	s := a.sessions[f.Session]
	if s == nil {
		host, err := a.cfg.NewSession(&o)
		if err != nil {
			a.mu.Unlock()
			fail(err.Error())
			return
		}
		s = &session{a: a, id: f.Session, reply: o.Reply, actor: o.ReplyActor, liveness: o.Liveness, host: host,
			lanes: map[laneID]*nodeLane{}, done: make(chan struct{}), kick: make(chan struct{}, 1)}
		s.heard.Store(time.Now().UnixNano())
		a.sessions[f.Session] = s
		a.wg.Add(2)
		go s.watch()
		go s.flush()
		a.log.Info("host session opened", zap.String("host", o.Reply), zap.Int("tasks", len(o.Tasks)))
	}
	s.heard.Store(time.Now().UnixNano())
	id := laneID{f.Lane, f.Inc}
	l := &nodeLane{s: s, id: id}
	s.mu.Lock()
	if s.fenced || s.lanes[id] != nil {
		s.mu.Unlock()
		a.mu.Unlock()
		fail("lane opened twice, or its session is ending")
		return
	}
	s.lanes[id] = l
	s.mu.Unlock()
	a.lanes++
	a.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		nl, err := s.host.StartLane(int(id.lane), int(id.inc), l)
		if err != nil {
			s.drop(l)
			fail(err.Error())
			return
		}
		l.start(nl)
	}()
}

type laneID struct{ lane, inc uint32 }

// A session is one host pool's lanes on this node.
type session struct {
	a        *Agent
	id       Session
	reply    string // the host's address
	actor    string // its pool's receiving actor
	liveness time.Duration
	host     LaneHost
	heard    atomic.Int64

	mu     sync.Mutex
	lanes  map[laneID]*nodeLane
	fenced bool
	why    string // why it was fenced
	// The outbox: frames for the host, in order, a lane's results gathered into one
	// Results frame until something else of that lane follows.
	out     [][]byte
	open    map[laneID]int // the lane's Results frame in out that still takes results
	sending bool           // a goroutine sends the outbox (send): the others leave it theirs
	sends   uint64         // the outbox's sends so far (the heartbeat's backstop looks)
	kick    chan struct{}
	done    chan struct{}
	ended   bool   // fence has run to the end: flush sends what is left and returns
	calls   []Call // lane's scratch, on the endpoint's actor goroutine: a frame's calls
}

func (s *session) isFenced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fenced
}

// lane hands a Calls, Cancel or Stop frame to its lane.
func (s *session) lane(f Frame) {
	s.mu.Lock()
	l := s.lanes[laneID{f.Lane, f.Inc}]
	s.mu.Unlock()
	if l == nil {
		return // it has ended (its end report covers these calls) or never started
	}
	switch f.Kind {
	case KindCalls:
		calls := s.calls[:0]
		defer func() { clear(calls); s.calls = calls[:0] }() // Submit keeps no pointer into it
		it := f.Items()
		for it.More() {
			c := it.Call()
			if it.Err() != nil {
				break
			}
			calls = append(calls, c)
		}
		l.submit(calls)
		if err := it.Err(); err != nil {
			s.a.log.Warn("a host sent calls that do not decode: its lane is killed", zap.Error(err))
			l.stop(true, "the host sent calls that do not decode")
		}
	case KindCancel:
		it := f.Items()
		for it.More() {
			seq := it.Cancel()
			if it.Err() != nil {
				break
			}
			l.cancel(seq)
		}
	case KindStop:
		kill, reason, err := f.Stop()
		if err != nil {
			kill, reason = true, "a stop request that does not decode"
		}
		l.stop(kill, reason)
	}
}

// drop forgets a lane that ended (or did not start).
func (s *session) drop(l *nodeLane) {
	s.mu.Lock()
	if s.lanes[l.id] == l {
		delete(s.lanes, l.id)
	}
	s.mu.Unlock()
	s.a.mu.Lock()
	s.a.lanes--
	s.a.mu.Unlock()
}

// watch fences the session once its host has been silent for its liveness timeout.
func (s *session) watch() {
	defer s.a.wg.Done()
	t := time.NewTicker(max(s.liveness/4, time.Millisecond))
	defer t.Stop()
	var sends uint64
	stale := false
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		if still := time.Since(time.Unix(0, s.heard.Load())); still > s.liveness {
			s.fence(fmt.Sprintf("no word from the host for %v", still.Round(time.Millisecond)))
			return
		}
		// A backstop: frames left in the outbox across two looks with no send between (a
		// lane that did not flush its results: a bug) go now, not never.
		s.mu.Lock()
		unsent := len(s.out) > 0 && !s.sending && s.sends == sends
		sends = s.sends
		s.mu.Unlock()
		if unsent && stale {
			s.a.log.Warn("frames for a host waited for the heartbeat: a lane did not flush its results", zap.String("host", s.reply))
			s.poke()
		}
		stale = unsent
	}
}

// fence ends the session: its lanes are killed at once (their ends still go to the host,
// should it hear), and nothing of it is taken any more.
func (s *session) fence(why string) {
	s.mu.Lock()
	if s.fenced {
		s.mu.Unlock()
		return
	}
	s.fenced, s.why = true, why
	s.mu.Unlock()
	s.a.mu.Lock()
	if s.a.sessions[s.id] == s {
		delete(s.a.sessions, s.id)
	}
	s.a.mu.Unlock()
	s.a.log.Warn("host session fenced: its lanes are killed", zap.String("host", s.reply), zap.String("reason", why))
	s.host.Close() // kills every lane and waits for their ends, which the outbox takes
	s.a.log.Info("host session closed: no lane of it is left", zap.String("host", s.reply))
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	close(s.done)
	s.poke()
}

func (s *session) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// result appends a result of lane id to the outbox: to the lane's open Results frame, or a
// new one. It goes with the lane's next Flush (or its end report).
func (s *session) result(id laneID, rs ...Result) {
	s.mu.Lock()
	if s.open == nil {
		s.open = map[laneID]int{}
	}
	i, ok := s.open[id]
	for k := range rs {
		if !ok || len(s.out[i]) >= FrameTarget {
			s.out = append(s.out, AppendHeader(make([]byte, 0, 512), KindResults, s.id, id.lane, id.inc))
			i, ok = len(s.out)-1, true
			s.open[id] = i
		}
		s.out[i] = AppendResult(s.out[i], &rs[k])
	}
	s.mu.Unlock()
}

// send sends the outbox, in order, on the calling goroutine, unless another goroutine is
// sending it: that one sends what was added meanwhile too, before it lets go. Sends are
// posts to protoactor's endpoint, which never block.
func (s *session) send() {
	s.mu.Lock()
	if s.sending {
		s.mu.Unlock()
		return
	}
	s.sending = true
	for len(s.out) > 0 {
		out := s.out
		s.out, s.open = nil, nil
		s.sends++
		s.mu.Unlock()
		stamp.S(stamp.ResultsSend)
		for _, f := range out {
			s.a.ep.Send(s.reply, s.actor, f)
		}
		stamp.S(stamp.ResultsSent)
		s.mu.Lock()
	}
	s.sending = false
	ended := s.ended
	s.mu.Unlock()
	if ended {
		s.poke() // the flusher may wait for this send to end
	}
}

// control appends a frame of lane id other than results to the outbox.
func (s *session) control(id laneID, frame []byte) {
	s.mu.Lock()
	s.out = append(s.out, frame)
	delete(s.open, id) // later results go after it
	s.mu.Unlock()
	s.poke()
}

// flush sends the outbox whenever it is poked (control frames, the heartbeat's backstop);
// it returns once the session is fenced and everything is sent.
func (s *session) flush() {
	defer s.a.wg.Done()
	for {
		<-s.kick
		s.send()
		s.mu.Lock()
		done := s.ended && !s.sending && len(s.out) == 0
		s.mu.Unlock()
		if done {
			return
		}
	}
}

// A nodeLane is one lane of a session, between the agent and its LaneHost.
type nodeLane struct {
	s  *session
	id laneID

	mu      sync.Mutex
	lane    NodeLane // nil until started
	stopped *[2]any  // a stop that came before the lane had started: kill, reason
	ended   bool
}

func (l *nodeLane) start(nl NodeLane) {
	l.mu.Lock()
	l.lane = nl
	stop := l.stopped
	l.mu.Unlock()
	l.s.control(l.id, AppendReady(AppendHeader(nil, KindReady, l.s.id, l.id.lane, l.id.inc), nl.PID()))
	if stop != nil {
		nl.Stop(stop[0].(bool), stop[1].(string))
	}
}

func (l *nodeLane) get() NodeLane {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lane
}

func (l *nodeLane) submit(calls []Call) {
	if nl := l.get(); nl != nil && len(calls) > 0 {
		_ = nl.Submit(calls) // a lane that ended has reported which calls it started
	}
}

func (l *nodeLane) cancel(seq uint64) {
	if nl := l.get(); nl != nil {
		nl.Cancel(seq)
	}
}

func (l *nodeLane) stop(kill bool, reason string) {
	l.mu.Lock()
	nl := l.lane
	if nl == nil {
		l.stopped = &[2]any{kill, reason}
	}
	l.mu.Unlock()
	if nl != nil {
		nl.Stop(kill, reason)
	}
}

// Result implements LaneOut.
func (l *nodeLane) Result(r Result) { l.s.result(l.id, r) }

// Results implements LaneOut.
func (l *nodeLane) Results(rs []Result) { l.s.result(l.id, rs...) }

// Flush implements LaneOut.
func (l *nodeLane) Flush() { l.s.send() }

// Ended implements LaneOut.
func (l *nodeLane) Ended(e *Ended) {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	l.ended = true
	l.mu.Unlock()
	l.s.mu.Lock()
	fenced, why := l.s.fenced, l.s.why
	l.s.mu.Unlock()
	if fenced { // killed by the fence: the host, should it hear, counts it as its node lost
		r := *e
		r.Code, r.Message, r.Normal = string(lifecycle.CodeNodeLost), "the node dropped this host's lanes: "+why, false
		e = &r
	}
	l.s.control(l.id, AppendEnded(AppendHeader(nil, KindEnded, l.s.id, l.id.lane, l.id.inc), e))
	l.s.drop(l)
}

// Serve runs a node's agent until ctx ends, then fences every session (their lanes are
// killed) and returns.
func Serve(ctx context.Context, cfg AgentConfig) error {
	if cfg.NewSession == nil {
		return errors.New("remote: no NewSession")
	}
	a, err := StartAgent(cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	a.Close()
	return nil
}
