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

// An Endpoint is one side's protoactor-go remote: an actor system of its own with the
// remote started on it, one actor under a fixed name that receives frames, and what knit
// adds around protoactor's transport — mutual TLS, a guard on every incoming stream, bounded
// batches, keepalive, its own dial check for clear errors, and a shutdown that never waits
// on a frozen peer. Hosts and nodes each run one; nothing in it knows about lanes.
type Endpoint struct {
	cfg   EndpointConfig
	sys   *actor.ActorSystem
	r     *remote.Remote
	conns *tracker
	sub   *eventstream.Subscription
	dial  []grpc.DialOption
	port  int

	mu     sync.Mutex
	pids   map[string]*actor.PID // by address: the peer's receiving actor
	closed bool
}

// EndpointConfig configures an Endpoint.
type EndpointConfig struct {
	// Listen is the host:port it listens on (port 0: any free one).
	Listen string
	// TLS, if set, makes every connection mutual TLS with it: peers without a certificate
	// it verifies are refused, and it presents its own certificate when it dials.
	TLS *tls.Config
	// Name is the receiving actor's name, Peer the one peers' frames go to.
	Name, Peer string
	// OnFrame receives every frame, in order, on the receiving actor's goroutine; it must
	// not block. The bytes are its own.
	OnFrame func(b []byte)
	// OnLost is told that the connection to address broke (protoactor's
	// EndpointTerminatedEvent); it must not block.
	OnLost func(address string)
	// Log is the remote namespace logger; protoactor's own lines go to it at Debug.
	Log *zap.Logger
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
)

// frameType is the only protobuf message type an endpoint accepts.
const frameType = "google.protobuf.BytesValue"

// Listen starts an endpoint.
func Listen(cfg EndpointConfig) (ep *Endpoint, err error) {
	host, portText, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > math.MaxUint16 {
		return nil, fmt.Errorf("listen address %q: bad port", cfg.Listen)
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	e := &Endpoint{cfg: cfg, conns: &tracker{conns: map[*trackedConn]struct{}{}}, pids: map[string]*actor.PID{}}
	serverCreds, clientCreds := credentials.TransportCredentials(insecure.NewCredentials()), credentials.TransportCredentials(insecure.NewCredentials())
	if cfg.TLS != nil {
		serverCreds, clientCreds = credentials.NewTLS(ServerTLS(cfg.TLS)), credentials.NewTLS(ClientTLS(cfg.TLS))
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
		grpc.ChainStreamInterceptor(guardStream(cfg.Name, cfg.Log)),
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
	slogger := protoactorLog(cfg.Log)
	e.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slogger }))
	e.r = remote.NewRemote(e.sys, rc)
	if err := e.start(); err != nil {
		e.sys.Shutdown()
		return nil, err
	}
	e.sub = e.sys.EventStream.SubscribeWithPredicate(func(ev any) {
		if t, ok := ev.(*remote.EndpointTerminatedEvent); ok && cfg.OnLost != nil {
			cfg.OnLost(t.Address)
		}
	}, func(ev any) bool { _, ok := ev.(*remote.EndpointTerminatedEvent); return ok })
	props := actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*wrapperspb.BytesValue); ok {
			e.deliver(m.Value)
		}
	})
	if _, err := e.sys.Root.SpawnNamed(props, cfg.Name); err != nil {
		e.Close()
		return nil, fmt.Errorf("spawning the %s actor: %w", cfg.Name, err)
	}
	return e, nil
}

// start starts protoactor's remote, which panics when it cannot listen.
func (e *Endpoint) start() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("starting the remote endpoint on %s: %v", e.cfg.Listen, r)
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

// deliver hands a frame to OnFrame; a panic there is a bug of knit's, logged, never the end
// of the receiving actor's mailbox.
func (e *Endpoint) deliver(b []byte) {
	defer func() {
		if r := recover(); r != nil {
			e.cfg.Log.Error("handling a frame panicked", zap.Any("panic", r), zap.Stack("stack"))
		}
	}()
	e.cfg.OnFrame(b)
}

// Port is the port the endpoint listens on.
func (e *Endpoint) Port() int { return e.port }

// Send sends a frame to the peer actor at address. It does not wait and never fails: a
// frame to a peer that is gone is lost, which the heartbeat notices.
func (e *Endpoint) Send(address string, frame []byte) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	pid := e.pids[address]
	if pid == nil {
		pid = actor.NewPID(address, e.cfg.Peer)
		e.pids[address] = pid
	}
	e.mu.Unlock()
	e.sys.Root.Send(pid, &wrapperspb.BytesValue{Value: frame})
}

// Check dials address the way the endpoint's connections do (TLS included) and asks for a
// knit endpoint there, so that an unreachable or refusing peer is a clear error: connection
// refused, a certificate not trusted, or something else listening.
func (e *Endpoint) Check(ctx context.Context, address string) error {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	conn, err := grpc.DialContext(ctx, address, e.dial...)
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

// Close stops the endpoint: every connection is cut first, so that nothing waits on a peer
// that has stopped reading, then protoactor's remote and the actor system stop.
func (e *Endpoint) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	e.mu.Unlock()
	if e.sub != nil {
		e.sys.EventStream.Unsubscribe(e.sub)
	}
	// Connections this side dialled go first: a writer blocked on a peer that stopped
	// reading returns, so protoactor can stop it. Connections peers dialled are cut only if
	// the shutdown waits for them (gRPC's graceful stop waits for every peer to close its
	// stream, which a frozen peer never does), and only after protoactor has told each of
	// their readers to leave: a reader ending on its own while protoactor does that is a
	// send on a closed channel inside protoactor.
	e.conns.closeAll(true)
	done := make(chan struct{})
	go func() {
		e.r.Shutdown(true)
		close(done)
	}()
	t := time.NewTimer(shutdownGrace)
	select {
	case <-done:
	case <-t.C:
		e.conns.closeAll(false)
		<-done
	}
	t.Stop()
	e.sys.Shutdown()
	e.conns.closeAll(false) // any made while it shut down
}

// shutdownGrace is how long Close lets peers close their streams before it cuts them.
const shutdownGrace = 500 * time.Millisecond

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
