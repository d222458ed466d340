package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// An Endpoint is the process's protoactor-go remote: an actor system of its own with the
// remote started on it, and what knit adds around protoactor's transport — mutual TLS, a
// guard on every incoming stream, bounded batches, keepalive, its own dial check for clear
// errors, and a shutdown that never waits on a frozen peer. Every remote pool of the process
// and its node, if it runs one, are Members of it, each with a receiving actor of its own;
// nothing in it knows about lanes.
//
// One per process, because protoactor's remote sets gRPC's global logger whenever it starts,
// which gRPC reads, unsynchronised, from its connections' goroutines: a second start in a
// process that has used gRPC is a data race. The endpoint starts with its first member and
// stops with its last; members must agree on its listen address and TLS settings.
type Endpoint struct {
	listen string
	tls    *tls.Config
	sys    *actor.ActorSystem
	r      *remote.Remote
	conns  *tracker
	sub    *eventstream.Subscription
	dial   []grpc.DialOption
	port   int
	log    *zap.Logger

	mu      sync.Mutex
	pids    map[[2]string]*actor.PID // by address and actor name
	members map[*Member]struct{}
	closed  bool
}

// EndpointConfig configures a Member, and the endpoint if it is the first.
type EndpointConfig struct {
	// Listen is the host:port the endpoint listens on (port 0: any free one). A member
	// that joins a running endpoint may leave it empty or ":0".
	Listen string
	// TLS, if set, makes every connection mutual TLS with it: peers without a certificate
	// it verifies are refused, and it presents its own certificate when it dials. Every
	// member of an endpoint has the same (the same *tls.Config, or nil).
	TLS *tls.Config
	// Name is the member's receiving actor's name ("": a name of its own, HostName-N).
	Name string
	// OnFrame receives every frame sent to the member, in order, on its actor's
	// goroutine; it must not block. The bytes are its own.
	OnFrame func(b []byte)
	// OnLost is told that the connection to address broke (protoactor's
	// EndpointTerminatedEvent); it must not block.
	OnLost func(address string)
	// Log is the remote namespace logger; protoactor's own lines go to the first member's,
	// at Debug.
	Log *zap.Logger
}

// A Member is one user of the process's endpoint: a pool's, or the node's.
type Member struct {
	e       *Endpoint
	name    string
	pid     *actor.PID
	onFrame func([]byte)
	onLost  func(string)
	once    sync.Once
}

// Transport settings. A gRPC message is one batch of protoactor messages (up to
// writerBatch frames, each under MaxFrame), so the receive limit is set above what a batch
// can reach: a batch over gRPC's default 4 MiB would tear the connection down.
const (
	writerBatch   = 8
	writerQueue   = 1024 // initial size of a peer's send queue (it grows); the default is 10^6, preallocated
	maxRecvMsg    = writerBatch*MaxFrame + 1<<20
	keepaliveTime = 10 * time.Second // grpc-go's minimum
	keepaliveWait = 2 * time.Second
	dialTimeout   = 5 * time.Second
	// memberThroughput is how many messages a member's actor takes before it yields.
	memberThroughput = 300
)

// frameType is the only protobuf message type an endpoint accepts.
const frameType = "google.protobuf.BytesValue"

// The process's endpoint, its members and pins.
var process struct {
	mu   sync.Mutex
	ep   *Endpoint
	refs int // members, and pins
	seq  int // for members' names
}

// Pin keeps the process's endpoint, once started, running until unpin is called, even with
// no member: a test binary pins it for all its tests, so that it starts once (see Endpoint).
func Pin() (unpin func()) {
	process.mu.Lock()
	process.refs++
	process.mu.Unlock()
	var once sync.Once
	return func() { once.Do(release) }
}

func release() {
	process.mu.Lock()
	process.refs--
	var ep *Endpoint
	if process.refs == 0 && process.ep != nil {
		ep, process.ep = process.ep, nil
	}
	process.mu.Unlock()
	if ep != nil {
		ep.close()
	}
}

// Join makes a member of the process's endpoint, starting the endpoint if it is the first.
func Join(cfg EndpointConfig) (*Member, error) {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	process.mu.Lock()
	defer process.mu.Unlock()
	e := process.ep
	switch {
	case e == nil:
		var err error
		if e, err = start(cfg.Listen, cfg.TLS, cfg.Log); err != nil {
			return nil, err
		}
		process.ep = e
	case cfg.TLS != e.tls:
		return nil, fmt.Errorf("the process's remote endpoint runs with other TLS settings (one *tls.Config, or none, for every remote pool and node of a process)")
	case cfg.Listen != "" && cfg.Listen != ":0" && cfg.Listen != e.listen:
		return nil, fmt.Errorf("the process's remote endpoint listens on %s, not %s (one listen address for every remote pool and node of a process)", e.listen, cfg.Listen)
	}
	name := cfg.Name
	if name == "" {
		process.seq++
		name = fmt.Sprintf("%s-%d", HostName, process.seq)
	}
	m := &Member{e: e, name: name, onFrame: cfg.OnFrame, onLost: cfg.OnLost}
	// The synchronized dispatcher runs the actor on the goroutine that posts to its mailbox
	// (the connection's reader, for frames): OnFrame does not block. protoactor's default
	// starts a goroutine per burst of messages, which grows a fresh stack every time.
	props := actor.PropsFromFunc(func(c actor.Context) {
		if b, ok := c.Message().(*wrapperspb.BytesValue); ok {
			m.deliver(b.Value)
		}
	}, actor.WithDispatcher(actor.NewSynchronizedDispatcher(memberThroughput)))
	pid, err := e.sys.Root.SpawnNamed(props, name)
	if err != nil {
		if process.refs == 0 {
			process.ep = nil
			e.close()
		}
		return nil, fmt.Errorf("spawning the %s actor: %w", name, err)
	}
	m.pid = pid
	e.mu.Lock()
	e.members[m] = struct{}{}
	e.mu.Unlock()
	process.refs++
	return m, nil
}

// start starts the endpoint.
func start(listen string, tlsCfg *tls.Config, log *zap.Logger) (*Endpoint, error) {
	if listen == "" {
		listen = ":0"
	}
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > math.MaxUint16 {
		return nil, fmt.Errorf("listen address %q: bad port", listen)
	}
	e := &Endpoint{listen: listen, tls: tlsCfg, log: log, conns: &tracker{conns: map[*trackedConn]struct{}{}},
		pids: map[[2]string]*actor.PID{}, members: map[*Member]struct{}{}}
	serverCreds, clientCreds := credentials.TransportCredentials(insecure.NewCredentials()), credentials.TransportCredentials(insecure.NewCredentials())
	if tlsCfg != nil {
		serverCreds, clientCreds = credentials.NewTLS(ServerTLS(tlsCfg)), credentials.NewTLS(ClientTLS(tlsCfg))
	}
	e.dial = []grpc.DialOption{
		grpc.WithTransportCredentials(trackedCreds{clientCreds, e.conns}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveWait, PermitWithoutStream: true}),
	}
	server := []grpc.ServerOption{
		grpc.Creds(trackedCreds{serverCreds, e.conns}),
		grpc.MaxRecvMsgSize(maxRecvMsg),
		grpc.MaxConcurrentStreams(16),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveTime / 2, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveWait}),
		grpc.ChainStreamInterceptor(guardStream(log)),
		grpc.ChainUnaryInterceptor(refuseUnary),
	}
	rc := remote.Configure(host, port,
		remote.WithEndpointWriterBatchSize(writerBatch),
		remote.WithEndpointWriterQueueSize(writerQueue),
		remote.WithEndpointManagerQueueSize(writerQueue),
		remote.WithDialOptions(e.dial...),
		remote.WithServerOptions(server...))
	// A peer that refuses a connection is tried once (protoactor sleeps 2 s after each
	// failure): knit dials it itself first (Check), and retries on its own schedule.
	rc.MaxRetryCount = 1
	slogger := protoactorLog(log)
	// protoactor starts a goroutine per dead-letter burst that lives for the throttle
	// interval (1 s by default): frames to a pool that has just closed are dead letters.
	e.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slogger }),
		actor.WithDeadLetterThrottleInterval(10*time.Millisecond))
	e.r = remote.NewRemote(e.sys, rc)
	if err := e.startRemote(); err != nil {
		e.sys.Shutdown()
		return nil, err
	}
	e.sub = e.sys.EventStream.SubscribeWithPredicate(func(ev any) {
		if t, ok := ev.(*remote.EndpointTerminatedEvent); ok {
			e.lost(t.Address)
		}
	}, func(ev any) bool { _, ok := ev.(*remote.EndpointTerminatedEvent); return ok })
	return e, nil
}

// startRemote starts protoactor's remote, which panics when it cannot listen.
func (e *Endpoint) startRemote() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("starting the remote endpoint on %s: %v", e.listen, r)
		}
	}()
	e.r.Start()
	_, portText, perr := net.SplitHostPort(e.sys.Address())
	if perr != nil {
		return fmt.Errorf("remote endpoint address %q: %w", e.sys.Address(), perr)
	}
	e.port, _ = strconv.Atoi(portText)
	return nil
}

// lost tells every member that the connection to address broke.
func (e *Endpoint) lost(address string) {
	e.mu.Lock()
	ms := make([]*Member, 0, len(e.members))
	for m := range e.members {
		ms = append(ms, m)
	}
	e.mu.Unlock()
	for _, m := range ms {
		if m.onLost != nil {
			m.onLost(address)
		}
	}
}

// deliver hands a frame to OnFrame; a panic there is a bug of knit's, logged, never the end
// of the receiving actor's mailbox.
func (m *Member) deliver(b []byte) {
	defer func() {
		if r := recover(); r != nil {
			m.e.log.Error("handling a frame panicked", zap.Any("panic", r), zap.Stack("stack"))
		}
	}()
	m.onFrame(b)
}

// Name is the member's receiving actor's name.
func (m *Member) Name() string { return m.name }

// Port is the port the endpoint listens on.
func (m *Member) Port() int { return m.e.port }

// Close ends the membership: the member's actor stops, and the endpoint with its last
// member.
func (m *Member) Close() {
	m.once.Do(func() {
		m.e.mu.Lock()
		delete(m.e.members, m)
		m.e.mu.Unlock()
		_ = m.e.sys.Root.StopFuture(m.pid).Wait()
		release()
	})
}

// Send sends a frame to the actor called name at address. It does not wait and never
// fails: a frame to a peer that is gone is lost, which the heartbeat notices.
func (m *Member) Send(address, name string, frame []byte) {
	e := m.e
	key := [2]string{address, name}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	pid := e.pids[key]
	if pid == nil {
		pid = actor.NewPID(address, name)
		e.pids[key] = pid
	}
	e.mu.Unlock()
	e.sys.Root.Send(pid, &wrapperspb.BytesValue{Value: frame})
}

// Check dials address the way the endpoint's connections do (TLS included) and asks for a
// knit endpoint there, so that an unreachable or refusing peer is a clear error: connection
// refused, a certificate not trusted, or something else listening.
func (m *Member) Check(ctx context.Context, address string) error {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	conn, err := grpc.DialContext(ctx, address, m.e.dial...)
	if err != nil {
		return err
	}
	defer conn.Close()
	err = conn.Invoke(ctx, "/remote.Remoting/ListProcesses", &remote.ListProcessesRequest{}, &remote.ListProcessesResponse{})
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unimplemented && s.Message() == knitEndpoint {
		return nil
	}
	if s, ok := status.FromError(err); ok && err != nil {
		if s.Code() == codes.DeadlineExceeded {
			return fmt.Errorf("no answer within %v", dialTimeout)
		}
		return errors.New(s.Message())
	}
	if err == nil {
		return errors.New("not a knit endpoint")
	}
	return err
}

// close stops the endpoint: every connection is cut, so that nothing waits on a peer that
// has stopped reading, then protoactor's remote and the actor system stop.
//
// protoactor's graceful shutdown is not used: it tells each reader to leave by a send on a
// channel that the reader's handler closes when its stream then ends, with nothing ordering
// the two (the race detector reports it), and a reader that ends on its own first makes it a
// send on a closed channel. Stopping the gRPC server ends every stream, and each reader
// removes itself.
func (e *Endpoint) close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.sys.EventStream.Unsubscribe(e.sub)
	e.conns.closeAll(true)
	e.r.Shutdown(false)
	e.conns.closeAll(false)
	e.sys.Shutdown()
	e.conns.closeAll(false) // any made while it shut down
}

// ServerTLS is cfg for the listening side: client certificates required and verified
// (against ClientCAs, or RootCAs when it has none), TLS 1.2 at least.
func ServerTLS(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.ClientAuth = tls.RequireAndVerifyClientCert
	if c.ClientCAs == nil {
		c.ClientCAs = c.RootCAs
	}
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	return c
}

// ClientTLS is cfg for the dialling side, TLS 1.2 at least.
func ClientTLS(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	return c
}

// knitEndpoint is the message of the Unimplemented status every unary call gets: Check
// recognises a knit endpoint by it.
const knitEndpoint = "knit endpoint: no unary calls"

// refuseUnary answers every unary call (protoactor's ListProcesses and
// GetProcessDiagnostics are panic("implement me")) with Unimplemented.
func refuseUnary(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
	return nil, status.Error(codes.Unimplemented, knitEndpoint)
}

// protoactorLog is the slog logger protoactor's actor system and remote write to: the
// remote namespace, every entry at Debug (protoactor logs a peer's routine departure as an
// error; knit logs what it means itself).
func protoactorLog(l *zap.Logger) *slog.Logger {
	return slog.New(zapslog.NewHandler(debugCore{l.Core()}, zapslog.WithName(l.Name()+".protoactor"),
		zapslog.AddStacktraceAt(slog.Level(math.MaxInt))))
}

type debugCore struct{ zapcore.Core }

func (c debugCore) Enabled(zapcore.Level) bool { return c.Core.Enabled(zapcore.DebugLevel) }
func (c debugCore) With(f []zapcore.Field) zapcore.Core {
	return debugCore{c.Core.With(f)}
}
func (c debugCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	ent.Level = zapcore.DebugLevel
	return c.Core.Check(ent, ce)
}

// trackedCreds wraps transport credentials so that every connection they hand gRPC, in
// either direction, is tracked: Close cuts them all, and gRPC's graceful stop, which waits
// for every peer to close its streams, then never waits on a frozen one.
type trackedCreds struct {
	credentials.TransportCredentials
	t *tracker
}

func (c trackedCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	return c.t.add(conn, true), info, nil
}

func (c trackedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	return c.t.add(conn, false), info, nil
}

func (c trackedCreds) Clone() credentials.TransportCredentials {
	return trackedCreds{c.TransportCredentials.Clone(), c.t}
}

type tracker struct {
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool // every connection made from now on is closed at once
}

type trackedConn struct {
	net.Conn
	t      *tracker
	client bool // dialled by this side
	once   sync.Once
}

func (t *tracker) add(c net.Conn, client bool) net.Conn {
	tc := &trackedConn{Conn: c, t: t, client: client}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return tc
	}
	t.conns[tc] = struct{}{}
	return tc
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}

// closeAll closes the connections this side dialled (client), or all of them, for good.
func (t *tracker) closeAll(client bool) {
	t.mu.Lock()
	if !client {
		t.closed = true
	}
	conns := make([]*trackedConn, 0, len(t.conns))
	for c := range t.conns {
		if c.client || !client {
			conns = append(conns, c)
		}
	}
	t.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}
