//go:build linux

package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/knitgo/knit"
)

// ============================================================================
// Remote rows — lanes on another machine (issue 32), against protoactor-go's own remote.
// ============================================================================
//
// Both sides run on loopback: the "machine" is a child process of this binary. For knit
// the child is a node (knit.ServeNode, role knit-node) whose lanes are in turn process
// lanes of this binary (the node's fast path); for protoactor it is an actor system with
// the remote started and an actor replying in+1 (role protoactor-echo), which the parent
// calls with RequestFuture through a remote of its own — the same transport, gRPC over
// one connection each way. Rows:
//
//   - round trip: knit Task.Call on a pool of one remote lane; protoactor RequestFuture.
//   - 1024 goroutines calling: runInFlight goroutines, each one blocking call after
//     another (knit: 2 lanes on the node).
//   - window 1024: one goroutine keeps 1024 calls in flight (knit Task.Go futures;
//     protoactor RequestFuture futures, pipelined over the connection).
//   - Map of 1024: knit Task.Map over 1024 inputs, per element.
//   - TLS: the round trip and window rows with mutual TLS (a CA and certificates made for
//     the run), on both.

const (
	implKnitRemote     = "knit-remote"
	implKnitRemoteTLS  = "knit-remote-tls"
	implActorRemote    = "actor-remote"
	implActorRemoteTLS = "actor-remote-tls"
)

// Child roles of the remote rows.
const (
	childKnitNode       = "knit-node"
	childProtoactorEcho = "protoactor-echo"
	tlsDirEnv           = "KNIT_BENCH_TLS" // a directory with ca.pem, cert.pem, key.pem: mutual TLS
	// nodeLaneSpinEnv sets the knit node's NodeConfig.LaneSpin (a duration), to compare a
	// spinning node with the default (none): KNIT_BENCH_NODE_LANE_SPIN=50us.
	nodeLaneSpinEnv = "KNIT_BENCH_NODE_LANE_SPIN"
	// nodeProcsEnv sets the knit node child's GOMAXPROCS (the harness's own is the
	// GOMAXPROCS variable, which the child inherits unless this is set):
	// KNIT_BENCH_NODE_GOMAXPROCS=1, to see what the Go scheduler costs on a small machine.
	nodeProcsEnv = "KNIT_BENCH_NODE_GOMAXPROCS"
)

// fewCallers is the goroutines of the "few goroutines calling" rows: fewer than a remote
// lane's window (knit's remote.Window, 256), which those calls never fill.
const fewCallers = 64

func remoteScenarios() []scenario {
	w := inFlightTarget
	var rows []scenario
	for _, tlsOn := range []bool{false, true} {
		impl, aimpl, tag := implKnitRemote, implActorRemote, ""
		if tlsOn {
			impl, aimpl, tag = implKnitRemoteTLS, implActorRemoteTLS, " TLS"
		}
		rows = append(rows,
			scenario{name: "protoactor remote" + tag + ": RequestFuture round trip", inFlight: 1,
				meta:  rowMeta{Impl: aimpl, Shape: shapeRoundTrip, Lanes: 1},
				setup: func() (func(*testing.B), func() error, error) { return setupActorRemote(tlsOn, 1, false) }},
			scenario{name: fmt.Sprintf("protoactor remote%s: window %d", tag, w), inFlight: w,
				meta:  rowMeta{Impl: aimpl, Shape: shapeWindow, Lanes: 1, Window: w},
				setup: func() (func(*testing.B), func() error, error) { return setupActorRemote(tlsOn, w, false) }},
			scenario{name: "knit remote" + tag + ", 1 lane: sequential Call", inFlight: 1,
				meta:  rowMeta{Impl: impl, Shape: shapeRoundTrip, Lanes: 1},
				setup: func() (func(*testing.B), func() error, error) { return setupKnitRemote(tlsOn, 1, "call") }},
			scenario{name: fmt.Sprintf("knit remote%s, %d lanes: window %d", tag, poolWorkers, w), inFlight: w,
				meta:  rowMeta{Impl: impl, Shape: shapeWindow, Lanes: poolWorkers, Window: w},
				setup: func() (func(*testing.B), func() error, error) { return setupKnitRemote(tlsOn, poolWorkers, "window") }},
		)
		if tlsOn {
			continue
		}
		rows = append(rows,
			scenario{name: fmt.Sprintf("protoactor remote: %d goroutines calling", w), inFlight: w,
				meta:  rowMeta{Impl: aimpl, Shape: shapeGoroutines, Lanes: 1, Window: w},
				setup: func() (func(*testing.B), func() error, error) { return setupActorRemote(false, w, true) }},
			scenario{name: fmt.Sprintf("knit remote, %d lanes: %d goroutines calling", poolWorkers, w), inFlight: w,
				meta: rowMeta{Impl: impl, Shape: shapeGoroutines, Lanes: poolWorkers, Window: w},
				setup: func() (func(*testing.B), func() error, error) {
					return setupKnitRemote(false, poolWorkers, "goroutines")
				}},
			scenario{name: fmt.Sprintf("protoactor remote: %d goroutines calling", fewCallers), inFlight: fewCallers,
				meta: rowMeta{Impl: aimpl, Shape: shapeGoroutines, Lanes: 1, Window: fewCallers},
				setup: func() (func(*testing.B), func() error, error) {
					return setupActorRemote(false, fewCallers, true)
				}},
			scenario{name: fmt.Sprintf("knit remote, %d lanes: %d goroutines calling", poolWorkers, fewCallers), inFlight: fewCallers,
				meta: rowMeta{Impl: impl, Shape: shapeGoroutines, Lanes: poolWorkers, Window: fewCallers},
				setup: func() (func(*testing.B), func() error, error) {
					return setupKnitRemote(false, poolWorkers, "few")
				}},
			scenario{name: fmt.Sprintf("knit remote, %d lanes: Map of %d", poolWorkers, w), inFlight: w,
				meta:  rowMeta{Impl: impl, Shape: shapeMap, Lanes: poolWorkers, Window: w},
				setup: func() (func(*testing.B), func() error, error) { return setupKnitRemote(false, poolWorkers, "map") }},
		)
	}
	return rows
}

// remoteTargets are issue 32's goals.
func remoteTargets(rs rowSet) []targetResult {
	w := inFlightTarget
	return []targetResult{
		ratioTarget("remote lane sequential Call ÷ protoactor remote RequestFuture round trip",
			rs.find(implKnitRemote, shapeRoundTrip, 1, 0), rs.find(implActorRemote, shapeRoundTrip, 1, 0), unitNs, "<=", 1.2,
			"knit remote, 1 lane: sequential Call", "protoactor remote: RequestFuture round trip"),
		ratioTarget(fmt.Sprintf("remote lanes, window %d ÷ protoactor remote, window %d (throughput)", w, w),
			rs.find(implKnitRemote, shapeWindow, poolWorkers, w), rs.find(implActorRemote, shapeWindow, 1, w), unitCallsPerSec, ">=", 2,
			"knit remote, 2 lanes: window 1024", "protoactor remote: window 1024"),
		ratioTarget(fmt.Sprintf("remote lanes, %d goroutines calling ÷ protoactor remote, same shape (throughput)", w),
			rs.find(implKnitRemote, shapeGoroutines, poolWorkers, w), rs.find(implActorRemote, shapeGoroutines, 1, w), unitCallsPerSec, ">=", 2,
			"knit remote, 2 lanes: 1024 goroutines calling", "protoactor remote: 1024 goroutines calling"),
		ratioTarget(fmt.Sprintf("remote lanes, Map of %d ÷ protoactor remote, window %d (throughput)", w, w),
			rs.find(implKnitRemote, shapeMap, poolWorkers, w), rs.find(implActorRemote, shapeWindow, 1, w), unitCallsPerSec, ">=", 2,
			"knit remote, 2 lanes: Map of 1024", "protoactor remote: window 1024"),
		ownBound(ratioTarget(fmt.Sprintf("remote lanes, %d goroutines calling ÷ protoactor remote, same shape (throughput)", fewCallers),
			rs.find(implKnitRemote, shapeGoroutines, poolWorkers, fewCallers), rs.find(implActorRemote, shapeGoroutines, 1, fewCallers), unitCallsPerSec, ">=", 1,
			fmt.Sprintf("knit remote, 2 lanes: %d goroutines calling", fewCallers), fmt.Sprintf("protoactor remote: %d goroutines calling", fewCallers)),
			"fewer callers than a lane's window"),
		tlsCost(ratioTarget("cost of TLS: remote lane sequential Call, TLS ÷ plaintext",
			rs.find(implKnitRemoteTLS, shapeRoundTrip, 1, 0), rs.find(implKnitRemote, shapeRoundTrip, 1, 0), unitNs, "<=", 1.5,
			"knit remote TLS, 1 lane: sequential Call", "knit remote, 1 lane: sequential Call")),
		tlsCost(ratioTarget(fmt.Sprintf("cost of TLS: remote lanes, window %d, TLS ÷ plaintext (throughput)", w),
			rs.find(implKnitRemoteTLS, shapeWindow, poolWorkers, w), rs.find(implKnitRemote, shapeWindow, poolWorkers, w), unitCallsPerSec, ">=", 0.67,
			"knit remote TLS, 2 lanes: window 1024", "knit remote, 2 lanes: window 1024")),
	}
}

func tlsCost(t targetResult) targetResult { return ownBound(t, "the issue asks for the figure") }

// ownBound marks a target the issue does not set: knit's own, for why.
func ownBound(t targetResult, why string) targetResult {
	t.Note = strings.TrimSpace(t.Note + " (knit's own bound: " + why + ")")
	return t
}

// nodeChild is a child process serving as a knit node, or a protoactor echo system.
type nodeChild struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

// startNodeChild starts this binary in role (childKnitNode or childProtoactorEcho), with
// mutual TLS from dir if it is not empty, and waits for the address it listens on.
func startNodeChild(role, dir string) (*nodeChild, error) {
	cmd, err := childCmd(role)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(cmd.Env, tlsDirEnv+"="+dir, "GORACE=atexit_sleep_ms=0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	n := &nodeChild{cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				addr <- a
			}
		}
		_ = cmd.Wait()
		close(n.done)
	}()
	select {
	case n.addr = <-addr:
		return n, nil
	case <-n.done:
		return nil, fmt.Errorf("%s child exited before it listened", role)
	case <-time.After(30 * time.Second):
		n.stop()
		return nil, fmt.Errorf("%s child did not listen within 30s", role)
	}
}

func (n *nodeChild) stop() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
}

// knitNodeMain is the knit-node child: a node on loopback until SIGTERM.
func knitNodeMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if v := os.Getenv(nodeProcsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "knit node:", nodeProcsEnv, "wants a positive integer, not", v)
			return 1
		}
		runtime.GOMAXPROCS(n)
	}
	cfg := knit.NodeConfig{Addr: "127.0.0.1:0", Logger: quietLogger(),
		Ready: func(addr string) { fmt.Printf("listening %s\n", addr) }}
	if v := os.Getenv(nodeLaneSpinEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, "knit node:", nodeLaneSpinEnv, err)
			return 1
		}
		cfg.LaneSpin = d
	}
	if dir := os.Getenv(tlsDirEnv); dir != "" {
		c, err := loadBenchTLS(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "knit node:", err)
			return 1
		}
		cfg.TLS = c
	}
	if err := knit.ServeNode(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "knit node:", err)
		return 1
	}
	return 0
}

// protoactorEchoMain is the protoactor-echo child: an actor replying in+1 to a
// UInt64Value, reached through protoactor's remote, until SIGTERM.
func protoactorEchoMain() int {
	sys, r, err := newActorRemote(os.Getenv(tlsDirEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "protoactor echo:", err)
		return 1
	}
	_, err = sys.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if v, ok := c.Message().(*wrapperspb.UInt64Value); ok {
			c.Respond(wrapperspb.UInt64(v.Value + 1))
		}
	}), "echo")
	if err != nil {
		fmt.Fprintln(os.Stderr, "protoactor echo:", err)
		return 1
	}
	fmt.Printf("listening %s\n", sys.Address())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	<-ch
	r.Shutdown(false)
	sys.Shutdown()
	return 0
}

// newActorRemote is an actor system with protoactor's remote started on loopback, with
// mutual TLS from dir if it is not empty, and its writer batches bounded as knit's are.
func newActorRemote(dir string) (*actor.ActorSystem, *remote.Remote, error) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}), actor.WithDeadLetterThrottleInterval(10*time.Millisecond))
	opts := []remote.ConfigOption{remote.WithEndpointWriterQueueSize(4096), remote.WithEndpointManagerQueueSize(4096)}
	if dir != "" {
		c, err := loadBenchTLS(dir)
		if err != nil {
			return nil, nil, err
		}
		srv := c.Clone()
		srv.ClientAuth, srv.ClientCAs = tls.RequireAndVerifyClientCert, c.RootCAs
		opts = append(opts, remote.WithServerOptions(grpc.Creds(credentials.NewTLS(srv))),
			remote.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(c))))
	}
	r := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0, opts...))
	r.Start()
	return sys, r, nil
}

// setupActorRemote: the parent's protoactor remote calls the echo child: one call at a
// time (w == 1), w goroutines each calling (goroutines), or one goroutine keeping w futures
// in flight.
func setupActorRemote(tlsOn bool, w int, goroutines bool) (func(*testing.B), func() error, error) {
	dir, err := benchTLSDir(tlsOn)
	if err != nil {
		return nil, nil, err
	}
	echo, err := startNodeChild(childProtoactorEcho, dir)
	if err != nil {
		return nil, nil, err
	}
	sys, r, err := newActorRemote(dir)
	if err != nil {
		echo.stop()
		return nil, nil, err
	}
	pid := actor.NewPID(echo.addr, "echo")
	call := func(v uint64) error {
		res, err := sys.Root.RequestFuture(pid, wrapperspb.UInt64(v), actorTimeout).Result()
		if err != nil {
			return fmt.Errorf("protoactor remote: %w", err)
		}
		if got, ok := res.(*wrapperspb.UInt64Value); !ok || got.Value != v+1 {
			return fmt.Errorf("protoactor remote: got %v, want %d", res, v+1)
		}
		return nil
	}
	cleanup := func() error {
		r.Shutdown(true) // graceful: its connections close, and their goroutines end
		sys.Shutdown()
		echo.stop()
		return nil
	}
	var v uint64
	var body func(*testing.B)
	switch {
	case w == 1:
		body = func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				v++
				if err := call(v); err != nil {
					fail(b, err)
					return
				}
			}
		}
	case goroutines:
		body = func(b *testing.B) {
			runGoroutines(b, w, func(pb *testing.PB) {
				var v uint64
				for pb.Next() {
					v++
					if err := call(v); err != nil {
						fail(b, err)
						return
					}
				}
			})
		}
	default:
		ring := make([]*actor.Future, w)
		body = func(b *testing.B) {
			n := b.N
			start := func(i int) {
				ring[i%w] = sys.Root.RequestFuture(pid, wrapperspb.UInt64(uint64(i)), actorTimeout)
			}
			for i := 0; i < min(w, n); i++ {
				start(i)
			}
			for i := 0; i < n; i++ {
				res, err := ring[i%w].Result()
				if got, ok := res.(*wrapperspb.UInt64Value); err == nil && (!ok || got.Value != uint64(i)+1) {
					err = fmt.Errorf("got %v, want %d", res, i+1)
				}
				if err != nil {
					fail(b, fmt.Errorf("protoactor remote: %w", err))
					for j := i + 1; j < min(i+w, n); j++ {
						_, _ = ring[j%w].Result()
					}
					return
				}
				if i+w < n {
					start(i + w)
				}
			}
		}
	}
	return body, cleanup, nil
}

// setupKnitRemote: a pool of lanes remote lanes on a node child; shape is call (one at a
// time), goroutines, window or map.
func setupKnitRemote(tlsOn bool, lanes int, shape string) (func(*testing.B), func() error, error) {
	dir, err := benchTLSDir(tlsOn)
	if err != nil {
		return nil, nil, err
	}
	node, err := startNodeChild(childKnitNode, dir)
	if err != nil {
		return nil, nil, err
	}
	cfg := knit.Config{Lanes: lanes, Runtime: knit.Remote, Logger: quietLogger(),
		Remote: knit.RemoteConfig{Nodes: []string{node.addr}}}
	if tlsOn {
		if cfg.Remote.TLS, err = loadBenchTLS(dir); err != nil {
			node.stop()
			return nil, nil, err
		}
	}
	var body func(*testing.B)
	var cleanup func() error
	switch shape {
	case "call":
		body, cleanup, err = setupKnitRoundTrip(cfg)
	case "goroutines":
		body, cleanup, err = setupKnitInFlight(cfg)
	case "few":
		body, cleanup, err = setupKnitGoroutines(cfg, fewCallers)
	case "window":
		body, cleanup, err = setupKnitWindow(cfg, inFlightTarget)
	case "map":
		body, cleanup, err = setupKnitMap(cfg, inFlightTarget)
	}
	if err != nil {
		node.stop()
		return nil, nil, err
	}
	return body, func() error {
		err := cleanup()
		node.stop()
		return err
	}, nil
}

// The run's certificates: a CA and one certificate for 127.0.0.1 with both usages, which
// every side presents; made once, in a directory removed at exit.
var benchTLS struct {
	once sync.Once
	dir  string
	err  error
}

func benchTLSDir(on bool) (string, error) {
	if !on {
		return "", nil
	}
	benchTLS.once.Do(func() { benchTLS.dir, benchTLS.err = writeBenchCerts() })
	return benchTLS.dir, benchTLS.err
}

// removeBenchTLS removes the run's certificates, if it made them.
func removeBenchTLS() {
	if benchTLS.dir != "" {
		_ = os.RemoveAll(benchTLS.dir)
	}
}

func writeBenchCerts() (string, error) {
	dir, err := os.MkdirTemp("", "knit-bench-tls-")
	if err != nil {
		return "", err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "knit bench CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "knit bench"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", err
	}
	for name, blk := range map[string]*pem.Block{
		"ca.pem": {Type: "CERTIFICATE", Bytes: caDER}, "cert.pem": {Type: "CERTIFICATE", Bytes: leafDER},
		"key.pem": {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(dir+"/"+name, pem.EncodeToMemory(blk), 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func loadBenchTLS(dir string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(dir+"/cert.pem", dir+"/key.pem")
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(dir + "/ca.pem")
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, ClientCAs: roots}, nil
}

// quietLogger drops knit's logs: a row's nodes come and go.
func quietLogger() *zap.Logger { return zap.NewNop() }
