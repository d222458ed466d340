package knit_test

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
	"errors"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	paactor "github.com/asynkron/protoactor-go/actor"
	paremote "github.com/asynkron/protoactor-go/remote"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/remote"
)

// Remote lanes: pools whose lanes run on nodes, here three node processes on loopback, each
// this test binary running TestRemoteNodeHelper (ServeNode), whose lanes are in turn this
// test binary's process lanes (TestMain calls knit.Main).

const (
	envNode    = "KNIT_TEST_NODE"     // the address a helper node listens on
	envNodeTLS = "KNIT_TEST_NODE_TLS" // a directory with ca.pem, node.pem, node-key.pem: mutual TLS
)

// TestRemoteNodeHelper is a node when KNIT_TEST_NODE says so: it serves until SIGTERM, and
// logs JSON lines on stdout, the first of them "node serving" with its address.
func TestRemoteNodeHelper(t *testing.T) {
	addr := os.Getenv(envNode)
	if addr == "" {
		t.Skip("a node of the remote tests: runs when " + envNode + " is set")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = ""
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(os.Stdout), zapcore.DebugLevel))
	cfg := knit.NodeConfig{Addr: addr, Logger: log, Liveness: 2 * time.Second}
	knit.PackAtAnyPace() // so that the calls that may pack do, and the tests exercise it
	if dir := os.Getenv(envNodeTLS); dir != "" {
		cfg.TLS = loadTLS(t, dir, "node")
	}
	if err := knit.ServeNode(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// testNode is a node process.
type testNode struct {
	t    testing.TB
	cmd  *exec.Cmd
	addr string

	mu    sync.Mutex
	lines []string
	more  chan struct{}
	exit  chan struct{}
}

// startNode starts a node listening on addr ("127.0.0.1:0": a free port), with env added,
// and waits until it serves. The test's cleanup kills it.
func startNode(t testing.TB, addr string, env ...string) *testNode {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestRemoteNodeHelper$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), envNode+"="+addr), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &testNode{t: t, cmd: cmd, more: make(chan struct{}, 1), exit: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			n.mu.Lock()
			n.lines = append(n.lines, sc.Text())
			n.mu.Unlock()
			select {
			case n.more <- struct{}{}:
			default:
			}
		}
		_ = cmd.Wait()
		close(n.exit)
	}()
	t.Cleanup(func() { n.kill() })
	line := n.await(`"msg":"node serving"`)
	i := strings.Index(line, `"addr":"`)
	if i < 0 {
		t.Fatalf("node: no address in %q", line)
	}
	n.addr = line[i+len(`"addr":"`):]
	n.addr = n.addr[:strings.IndexByte(n.addr, '"')]
	return n
}

// await waits for a line of the node's log containing s, and returns it.
func (n *testNode) await(s string) string {
	n.t.Helper()
	seen := 0
	deadline := time.NewTimer(60 * time.Second) // a hang, not a timing
	defer deadline.Stop()
	for {
		n.mu.Lock()
		lines := n.lines[seen:]
		n.mu.Unlock()
		for _, l := range lines {
			if strings.Contains(l, s) {
				return l
			}
		}
		seen += len(lines)
		select {
		case <-n.more:
		case <-n.exit:
			n.mu.Lock()
			for _, l := range n.lines[seen:] {
				if strings.Contains(l, s) {
					n.mu.Unlock()
					return l
				}
			}
			n.mu.Unlock()
			n.t.Fatalf("node %s exited before logging %q", n.addr, s)
		case <-deadline.C:
			n.t.Fatalf("node %s: no %q in its log within a minute", n.addr, s)
		}
	}
}

// kill SIGKILLs the node and waits for it.
func (n *testNode) kill() {
	_ = n.cmd.Process.Kill()
	<-n.exit
}

// stop ends the node with SIGTERM (ServeNode returns) and waits for it.
func (n *testNode) stop() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	<-n.exit
}

// lanes lists the node's child processes: its lanes and spares.
func (n *testNode) children() []string { return childrenOf(n.cmd.Process.Pid) }

func childrenOf(pid int) []string {
	me := fmt.Sprint(pid)
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var kids []string
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+2:]))
		if len(f) > 1 && f[1] == me {
			kids = append(kids, s)
		}
	}
	return kids
}

func startNodes(t testing.TB, n int, env ...string) []*testNode {
	t.Helper()
	nodes := make([]*testNode, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { nodes[i] = startNode(t, "127.0.0.1:0", env...) })
	}
	wg.Wait()
	for _, nd := range nodes {
		if nd == nil {
			t.FailNow()
		}
	}
	return nodes
}

func addrs(nodes []*testNode) []string {
	var a []string
	for _, n := range nodes {
		a = append(a, n.addr)
	}
	return a
}

func remotePool(t testing.TB, cfg knit.Config, nodes []*testNode, tasks ...knit.Definition) *knit.Pool {
	t.Helper()
	cfg.Runtime = knit.Remote
	cfg.Remote.Nodes = addrs(nodes)
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	if len(tasks) == 0 {
		tasks = []knit.Definition{add, echo, fail, boom}
	}
	p, err := knit.NewPool(cfg, tasks...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// TestRemoteAnswers: a pool of six lanes over three nodes gets the right answer from every
// lane, codes cross, Stats names each lane's node, and Close leaves no lane process.
func TestRemoteAnswers(t *testing.T) {
	nodes := startNodes(t, 3)
	p := remotePool(t, knit.Config{Lanes: 6}, nodes)
	st := p.Stats()
	perNode := map[string]int{}
	for _, l := range st.Lanes {
		perNode[l.Node]++
	}
	for _, n := range nodes {
		if perNode[n.addr] != 2 {
			t.Errorf("node %s runs %d lanes, want 2 (%v)", n.addr, perNode[n.addr], perNode)
		}
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			for i := range 200 {
				sum, err := add.Call(ctx, p, [2]int64{int64(i), int64(g)})
				if err != nil || sum != int64(i+g) {
					t.Errorf("add %d+%d: %d, %v", i, g, sum, err)
					return
				}
			}
		})
	}
	wg.Wait()
	big := make([]byte, 100<<10)
	for i := range big {
		big[i] = byte(i)
	}
	out, err := echo.Call(ctx, p, big)
	if err != nil || string(out) != string(big) {
		t.Errorf("echo of 100 KiB: %d bytes, %v", len(out), err)
	}
	_, err = fail.Call(ctx, p, "no luck")
	wantCode(t, "a task's error", err, knit.CodeTaskError)
	if err == nil || !strings.Contains(err.Error(), "no luck") {
		t.Errorf("a task's error: %v", err)
	}
	_, err = boom.Call(ctx, p, "kaboom")
	wantCode(t, "a panic", err, knit.CodeTaskPanic)
	var futs []*knit.Future[int64]
	for i := range 1000 {
		futs = append(futs, add.Go(ctx, p, [2]int64{int64(i), 1}))
	}
	for i, f := range futs {
		if v, err := f.Wait(); err != nil || v != int64(i+1) {
			t.Fatalf("future %d: %d, %v", i, v, err)
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.await(`"msg":"host session closed`)
		if kids := n.children(); len(kids) > 0 {
			// Spares may be left only until the session's pool has closed.
			t.Errorf("node %s: processes left after Close: %v", n.addr, kids)
		}
	}
	_ = errors.New
}

// TestRemoteWindow keeps a window of 1024 futures in flight over two remote lanes, each
// settled future replaced by a new call at once, so that each lane's window of 256 calls on
// its node fills and drains thousands of times with calls waiting behind it: every call
// settles with its own result, and no forwarder needed the heartbeat's backstop to wake.
// (It hung when a forward filled the window to its last slot and the forwarder parked
// without asking to be rung when results freed room. Now the backstop would wake it within
// two heartbeats, Liveness/2, and count it: the test fails on the count, not by hanging.)
func TestRemoteWindow(t *testing.T) {
	nodes := startNodes(t, 1)
	p := remotePool(t, knit.Config{Lanes: 2}, nodes)
	ctx := context.Background()
	const w, n = 1024, 20000
	ring := make([]*knit.Future[int64], w)
	for i := range w {
		ring[i] = add.Go(ctx, p, [2]int64{int64(i), 1})
	}
	for i := range n {
		v, err := ring[i%w].Wait()
		if err != nil || v != int64(i+1) {
			t.Fatalf("call %d: %d, %v", i, v, err)
		}
		if i+w < n {
			ring[i%w] = add.Go(ctx, p, [2]int64{int64(i + w), 1})
		}
	}
	out, err := add.Map(ctx, p, func() [][2]int64 {
		in := make([][2]int64, 5000)
		for i := range in {
			in[i] = [2]int64{int64(i), 2}
		}
		return in
	}())
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range out {
		if v != int64(i+2) {
			t.Fatalf("Map item %d: %d", i, v)
		}
	}
	var done int64
	for _, l := range p.Stats().Lanes {
		done += int64(l.TotalCompleted)
	}
	// A Map's elements travel in chunks of at most 128, each one call on a lane.
	if done < n+5000/128 {
		t.Errorf("the lanes report %d calls completed, want %d at least", done, n+5000/128)
	}
	if m := knit.RemoteMissedWakes(p); m != 0 {
		t.Errorf("the heartbeat woke a forwarder that had slept through calls %d times", m)
	}
	// Calls wait in the lanes' backlogs whenever a window is full: once half of it is free,
	// the forwarder sends that half at once, refilling its 32-slot ring as it goes.
	if wide := knit.RemoteWidestForward(p); wide <= 32 {
		t.Errorf("a forwarder sent at most %d calls at once, want more than a ring's 32", wide)
	}
	// The window's calls (no deadline, no cancel) packed on the node.
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if l := nodes[0].await(`"host session ended"`); !strings.Contains(l, `"chunks_packed":`) || strings.Contains(l, `"chunks_packed":0`) {
		t.Errorf("the node packed no call: %s", l)
	}
}

// remoteLoad runs chaosOnce and chaosIdem calls (alternately, by id) from goroutines until
// stopped, keeping each call's error.
type remoteLoad struct {
	next atomic.Int64
	errs []error
	done chan struct{} // a token per finished call
	stop chan struct{}
	wg   sync.WaitGroup
}

func startRemoteLoad(p *knit.Pool, goroutines, ids int) *remoteLoad {
	ld := &remoteLoad{errs: make([]error, ids), done: make(chan struct{}, ids), stop: make(chan struct{})}
	for range goroutines {
		ld.wg.Go(func() {
			for {
				select {
				case <-ld.stop:
					return
				default:
				}
				id := int(ld.next.Add(1) - 1)
				if id >= ids {
					return
				}
				task := chaosOnce
				if id%2 == 1 {
					task = chaosIdem
				}
				got, err := task.Call(context.Background(), p, chaosCall{ID: id})
				if err == nil && got != 2*id {
					err = fmt.Errorf("call %d returned %d", id, got)
				}
				ld.errs[id] = err
				ld.done <- struct{}{}
			}
		})
	}
	return ld
}

// wait waits for n more calls to finish.
func (ld *remoteLoad) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-ld.done:
		case <-time.After(time.Minute): // a hang, not a timing
			t.Fatalf("calls stopped finishing")
		}
	}
}

// finish stops the load and returns how many calls were made.
func (ld *remoteLoad) finish() int {
	close(ld.stop)
	ld.wg.Wait()
	return min(int(ld.next.Load()), len(ld.errs))
}

// checkInDoubt checks a load's calls against the run log: every Idempotent call (odd ids)
// succeeded; a plain one that succeeded ran once, and one that failed did so with its node
// lost (it was in doubt) and ran at most once; none ran twice. It returns how many failed.
func checkInDoubt(t *testing.T, ld *remoteLoad, n int, runs []atomic.Uint32) int {
	t.Helper()
	failed := 0
	for id := range n {
		err, r := ld.errs[id], runs[id].Load()
		var ke *knit.Error
		switch {
		case id%2 == 1 && err != nil:
			t.Errorf("idempotent call %d: %v", id, err)
		case id%2 == 1 && (r < 1 || r > 2):
			t.Errorf("idempotent call %d ran %d times", id, r)
		case id%2 == 1: // it may have run on the lost node too
		case err == nil && r != 1:
			t.Errorf("call %d succeeded and ran %d times", id, r)
		case err != nil && (!errors.As(err, &ke) || ke.Code != knit.CodeNodeLost || !ke.Started):
			t.Errorf("call %d: %v, want NODE_LOST, started", id, err)
		case err != nil && r > 1:
			t.Errorf("call %d failed and ran %d times", id, r)
		case err != nil:
			failed++
		}
	}
	return failed
}

// onNode counts a pool's lanes on each node.
func onNode(p *knit.Pool) map[string]int {
	m := map[string]int{}
	for _, l := range p.Stats().Lanes {
		if l.State == knit.StateReady {
			m[l.Node]++
		}
	}
	return m
}

// placed waits until n lanes are ready — the last calls may have started a recycle (a lane
// being replaced is on no node) — and returns how many are on each node.
func placed(t *testing.T, p *knit.Pool, rec *recorder, n int) map[string]int {
	t.Helper()
	for {
		mark := rec.mark() // before the look: a lane ready after it is an event after mark
		where, ready := onNode(p), 0
		for _, k := range where {
			ready += k
		}
		if ready >= n {
			return where
		}
		rec.awaitFrom(t, mark, fmt.Sprintf("%d lanes ready (%v)", n, where), func(e knit.Event) bool { return e.To == knit.StateReady })
	}
}

// TestRemoteNodeKilled: a node SIGKILLed under load. Every call settles; every Idempotent
// call succeeds; a plain call either succeeded and ran once or failed NODE_LOST (it was on
// the node, in doubt) and ran at most once; the node's lanes come back on the survivors.
func TestRemoteNodeKilled(t *testing.T) {
	const ids = 1 << 20
	path, runs := fileRuns(t, ids)
	nodes := startNodes(t, 3, envRuns+"="+path)
	rec := newRecorder()
	p := remotePool(t, knit.Config{Lanes: 6, Liveness: 2 * time.Second, OnEvent: rec.record}, nodes, chaosOnce, chaosIdem)
	ld := startRemoteLoad(p, 24, ids)
	ld.wait(t, 2000)
	victim := nodes[1]
	mark := rec.mark()
	victim.kill()
	// Its two lanes (1 and 4) end NODE_LOST and come back, on the survivors.
	for _, lane := range []int{1, 4} {
		rec.awaitFrom(t, mark, fmt.Sprintf("lane %d lost with its node", lane), func(e knit.Event) bool {
			return e.Lane == lane && e.To == knit.StateCrashed && e.Code == knit.CodeNodeLost
		})
		rec.awaitFrom(t, mark, fmt.Sprintf("lane %d back", lane), func(e knit.Event) bool {
			return e.Lane == lane && e.To == knit.StateReady
		})
	}
	ld.wait(t, 2000)
	n := ld.finish()
	failed := checkInDoubt(t, ld, n, runs)
	where := placed(t, p, rec, 6)
	if where[victim.addr] != 0 || where[nodes[0].addr]+where[nodes[2].addr] != 6 {
		t.Errorf("lanes per node after the loss: %v", where)
	}
	t.Logf("%d calls, %d in doubt and failed; lanes per node %v", n, failed, where)
}

// TestRemoteNodeFrozen: a SIGSTOPped node breaks no connection; the heartbeat notices it
// within Liveness: its lane ends NODE_LOST and comes back on another node while calls go
// on. Once it runs again it drops the host's lanes (fencing), and its lane moves back to it.
func TestRemoteNodeFrozen(t *testing.T) {
	const ids = 1 << 20
	path, runs := fileRuns(t, ids)
	nodes := startNodes(t, 3, envRuns+"="+path)
	rec := newRecorder()
	p := remotePool(t, knit.Config{Lanes: 3, Liveness: 1500 * time.Millisecond, OnEvent: rec.record}, nodes, chaosOnce, chaosIdem)
	ld := startRemoteLoad(p, 12, ids)
	ld.wait(t, 500)
	victim := nodes[2]
	mark := rec.mark()
	if err := syscall.Kill(victim.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	lost := rec.awaitFrom(t, mark, "lane 2 lost with its frozen node", func(e knit.Event) bool {
		return e.Lane == 2 && e.To == knit.StateCrashed
	})
	if lost.Code != knit.CodeNodeLost || !strings.Contains(lost.Reason, "heartbeat") {
		t.Errorf("lane 2 ended %s: %s, want NODE_LOST by the heartbeat", lost.Code, lost.Reason)
	}
	rec.awaitFrom(t, mark, "lane 2 back", func(e knit.Event) bool { return e.Lane == 2 && e.To == knit.StateReady })
	if node := p.Stats().Lanes[2].Node; node == victim.addr {
		t.Errorf("lane 2 restarted on its frozen node")
	}
	ld.wait(t, 500)
	n := ld.finish()
	failed := checkInDoubt(t, ld, n, runs)
	t.Logf("%d calls, %d in doubt and failed", n, failed)
	// Running again, the node has dropped the host's lane (its session is fenced), and
	// the lane moves back home once the node answers.
	mark = rec.mark()
	if err := syscall.Kill(victim.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	victim.await(`"msg":"host session closed`)
	rec.awaitFrom(t, mark, "lane 2 moved home", func(e knit.Event) bool {
		return e.Lane == 2 && e.To == knit.StateRecycling && strings.Contains(e.Reason, "home node")
	})
	rec.awaitFrom(t, mark, "lane 2 ready at home", func(e knit.Event) bool { return e.Lane == 2 && e.To == knit.StateReady })
	if node := p.Stats().Lanes[2].Node; node != victim.addr {
		t.Errorf("lane 2 is on %s, want its home node %s", node, victim.addr)
	}
}

// TestRemoteNodeRestarted: a node killed and started again at its address takes its lanes
// back, gracefully (a recycle: no call fails), and they serve there.
func TestRemoteNodeRestarted(t *testing.T) {
	nodes := startNodes(t, 2)
	rec := newRecorder()
	p := remotePool(t, knit.Config{Lanes: 4, OnEvent: rec.record}, nodes)
	victim := nodes[1]
	mark := rec.mark()
	victim.kill()
	for _, lane := range []int{1, 3} {
		rec.awaitFrom(t, mark, fmt.Sprintf("lane %d back", lane), func(e knit.Event) bool {
			return e.Lane == lane && e.To == knit.StateReady
		})
	}
	if where := placed(t, p, rec, 4); where[nodes[0].addr] != 4 {
		t.Errorf("lanes per node with one node down: %v", where)
	}
	mark = rec.mark()
	again := startNode(t, victim.addr)
	for _, lane := range []int{1, 3} {
		rec.awaitFrom(t, mark, fmt.Sprintf("lane %d moved home", lane), func(e knit.Event) bool {
			return e.Lane == lane && e.To == knit.StateRecycling
		})
		rec.awaitFrom(t, mark, fmt.Sprintf("lane %d's old incarnation stopped", lane), func(e knit.Event) bool {
			return e.Lane == lane && e.To == knit.StateClosed
		})
	}
	addConcurrentlyRemote(t, p, 400)
	if where := placed(t, p, rec, 4); where[nodes[0].addr] != 2 || where[again.addr] != 2 {
		t.Errorf("lanes per node once the node is back: %v", where)
	}
}

// addConcurrentlyRemote makes n add calls from 8 goroutines and checks every sum.
func addConcurrentlyRemote(t *testing.T, p *knit.Pool, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 1}); err != nil || sum != int64(i+1) {
					t.Errorf("add %d: %d, %v", i, sum, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestRemoteCloseWithNodeDown: Close returns with a node frozen (the worst case: no
// connection breaks) and another killed; every lane ends closed.
func TestRemoteCloseWithNodeDown(t *testing.T) {
	nodes := startNodes(t, 3)
	rec := newRecorder()
	p := remotePool(t, knit.Config{Lanes: 3, KillGrace: 200 * time.Millisecond, OnEvent: rec.record}, nodes)
	addConcurrentlyRemote(t, p, 100)
	if err := syscall.Kill(nodes[1].cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	nodes[2].kill()
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, l := range p.Stats().Lanes {
		// The killed node's lane may have been waiting for its restart.
		if l.State == knit.StateReady || l.State == knit.StateBooting || l.State == knit.StateStopping {
			t.Errorf("lane %d is %s after Close", l.Lane, l.State)
		}
	}
	_ = syscall.Kill(nodes[1].cmd.Process.Pid, syscall.SIGCONT)
}

// TestRemoteUnreachable: a node nobody listens for, or one that never answers, fails
// NewPool with WORKER_STARTUP_FAILED saying so, within StartupTimeout.
func TestRemoteUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	silent := l.Addr().String() // accepts connections (the kernel does), never answers
	defer l.Close()
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l2.Addr().String()
	l2.Close()
	for _, c := range []struct{ addr, want string }{
		{refused, "connection refused"},
		{silent, "startup timeout"},
	} {
		_, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Remote, Remote: knit.RemoteConfig{Nodes: []string{c.addr}},
			StartupTimeout: time.Second, Logger: quiet()}, add)
		wantCode(t, c.addr, err, knit.CodeStartupFailed)
		if !strings.Contains(err.Error(), c.addr) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewPool with node %s: %v, want it named and %q", c.addr, err, c.want)
		}
	}
}

// A host in a child process: its endpoint, and so its TLS settings, are its own (a process's
// pools share one endpoint).

const (
	envHost  = "KNIT_TEST_REMOTE_HOST" // what the helper host does: calls, nocert, plain, hold
	envNodes = "KNIT_TEST_NODES"       // the nodes it uses, comma-separated
)

// TestRemoteHostHelper is a host when KNIT_TEST_REMOTE_HOST says so. It prints one line,
// "result: ok" or "result: " and the error, except in mode hold, which prints "result:
// ready" once its pool serves and then waits to be killed.
func TestRemoteHostHelper(t *testing.T) {
	mode := os.Getenv(envHost)
	if mode == "" {
		t.Skip("a host of the remote tests: runs when " + envHost + " is set")
	}
	cfg := knit.Config{Lanes: 2, Runtime: knit.Remote, Logger: quiet(), StartupTimeout: 10 * time.Second,
		Remote: knit.RemoteConfig{Nodes: strings.Split(os.Getenv(envNodes), ",")}}
	dir := os.Getenv(envNodeTLS)
	switch mode {
	case "calls":
		if dir != "" {
			cfg.Remote.TLS = loadTLS(t, dir, "host")
		}
	case "nocert":
		cfg.Remote.TLS = loadTLS(t, dir, "host")
		cfg.Remote.TLS.Certificates = nil
	case "othercert":
		cfg.Remote.TLS = loadTLS(t, dir, "rogue")
	}
	p, err := knit.NewPool(cfg, add)
	if err != nil {
		fmt.Printf("result: %v\n", err)
		return
	}
	defer p.Close(context.Background())
	if mode == "hold" {
		fmt.Println("result: ready")
		select {}
	}
	for i := range 100 {
		if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 2}); err != nil || sum != int64(i+2) {
			fmt.Printf("result: add %d: %d, %v\n", i, sum, err)
			return
		}
	}
	fmt.Println("result: ok")
}

// runHost runs the helper host in mode against nodes and returns its result line.
func runHost(t *testing.T, mode string, nodes []*testNode, env ...string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestRemoteHostHelper$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), envHost+"="+mode, envNodes+"="+strings.Join(addrs(nodes), ",")), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	for _, l := range strings.Split(string(out), "\n") {
		if r, ok := strings.CutPrefix(l, "result: "); ok {
			return r
		}
	}
	t.Fatalf("host %s: no result (%v): %s", mode, err, out)
	return ""
}

// Certificates: a CA, and certificates it signs for 127.0.0.1 with both usages, for the
// nodes and the hosts; a rogue one signed by another CA.

func writeCerts(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCert(t, nil, nil, "knit test CA")
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	for _, name := range []string{"node", "host"} {
		c, k := newCert(t, ca, caKey, name)
		writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", c.Raw)
		writeKey(t, filepath.Join(dir, name+"-key.pem"), k)
	}
	other, otherKey := newCert(t, nil, nil, "another CA")
	c, k := newCert(t, other, otherKey, "rogue")
	writePEM(t, filepath.Join(dir, "rogue.pem"), "CERTIFICATE", c.Raw)
	writeKey(t, filepath.Join(dir, "rogue-key.pem"), k)
	return dir
}

// newCert makes a certificate signed by parent (nil: a self-signed CA).
func newCert(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
	}
	signer, signKey := tmpl, key
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	} else {
		signer, signKey = parent, parentKey
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeKey(t *testing.T, path string, k *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, path, "EC PRIVATE KEY", der)
}

// loadTLS is the TLS configuration of name (node, host or rogue) in dir: its certificate,
// and the test CA as the roots it trusts.
func loadTLS(t *testing.T, dir, name string) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, ClientCAs: roots}
}

// TestRemoteTLS: with mutual TLS, a host with a certificate the nodes trust serves; one
// without a certificate, with one another CA signed, or without TLS at all is refused
// (NewPool fails naming the node), and the nodes serve on.
func TestRemoteTLS(t *testing.T) {
	dir := writeCerts(t)
	nodes := startNodes(t, 2, envNodeTLS+"="+dir)
	if r := runHost(t, "calls", nodes, envNodeTLS+"="+dir); r != "ok" {
		t.Errorf("a host with a trusted certificate: %s", r)
	}
	for _, mode := range []string{"nocert", "othercert", "plain"} {
		env := envNodeTLS + "=" + dir
		if mode == "plain" {
			env = envNodeTLS + "="
		}
		r := runHost(t, mode, nodes, env)
		if !strings.Contains(r, "WORKER_STARTUP_FAILED") || !strings.Contains(r, nodes[0].addr) && !strings.Contains(r, nodes[1].addr) {
			t.Errorf("a host %s: %s, want its start refused", mode, r)
		}
		t.Logf("%s: %s", mode, r)
	}
	if r := runHost(t, "calls", nodes, envNodeTLS+"="+dir); r != "ok" {
		t.Errorf("a trusted host after the refused ones: %s", r)
	}
}

// TestRemoteHostKilledFenced: a node whose host dies drops the host's lanes (fencing): it
// kills their processes, and none is left.
func TestRemoteHostKilledFenced(t *testing.T) {
	node := startNode(t, "127.0.0.1:0")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestRemoteHostHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), envHost+"=hold", envNodes+"="+node.addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "result: ready" {
	}
	if len(node.children()) == 0 {
		t.Fatal("the node runs no lane for the host")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	node.await(`"msg":"host session fenced`)
	node.await(`"msg":"host session closed`)
	if kids := node.children(); len(kids) > 0 {
		t.Errorf("lane processes left on the node after its host died: %v", kids)
	}
}

// TestRemoteHostilePeer: whatever a peer sends a node — message types nobody registered,
// indices outside a batch's tables, another serializer, a system message that would stop
// its agent, a remote spawn, frames for other actors, frames that do not decode, a unary
// call protoactor never implemented, bytes that are no gRPC at all — the node neither
// crashes nor stops serving.
func TestRemoteHostilePeer(t *testing.T) {
	node := startNode(t, "127.0.0.1:0")
	conn, err := grpc.Dial(node.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := paremote.NewRemotingClient(conn)
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	agent := &paactor.PID{Address: node.addr, Id: remote.AgentName}
	bytesType := "google.protobuf.BytesValue"
	frame := marshal(wrapperspb.Bytes(remote.AppendHeader(nil, remote.KindPing, remote.Session{}, 0, 0)))
	refused := []struct {
		what  string
		batch *paremote.MessageBatch
	}{
		{"a message type nobody registered", &paremote.MessageBatch{TypeNames: []string{"no.such.Type"}, Targets: []*paactor.PID{agent},
			Envelopes: []*paremote.MessageEnvelope{{MessageData: []byte{1, 2, 3}}}}},
		{"a type index out of range", &paremote.MessageBatch{TypeNames: []string{bytesType}, Targets: []*paactor.PID{agent},
			Envelopes: []*paremote.MessageEnvelope{{TypeId: 7, MessageData: frame}}}},
		{"a target index out of range", &paremote.MessageBatch{TypeNames: []string{bytesType}, Targets: []*paactor.PID{agent},
			Envelopes: []*paremote.MessageEnvelope{{Target: 5, MessageData: frame}}}},
		{"a sender index out of range", &paremote.MessageBatch{TypeNames: []string{bytesType}, Targets: []*paactor.PID{agent},
			Envelopes: []*paremote.MessageEnvelope{{Sender: 3, MessageData: frame}}}},
		{"another serializer", &paremote.MessageBatch{TypeNames: []string{bytesType}, Targets: []*paactor.PID{agent},
			Envelopes: []*paremote.MessageEnvelope{{SerializerId: 9, MessageData: frame}}}},
		{"a system message stopping the agent", &paremote.MessageBatch{TypeNames: []string{"actor.Stop"}, Targets: []*paactor.PID{agent},
			Envelopes: []*paremote.MessageEnvelope{{MessageData: marshal(&paactor.Stop{})}}}},
		{"a remote spawn", &paremote.MessageBatch{TypeNames: []string{"remote.ActorPidRequest"},
			Targets:   []*paactor.PID{{Address: node.addr, Id: "activator"}},
			Envelopes: []*paremote.MessageEnvelope{{MessageData: marshal(&paremote.ActorPidRequest{Kind: "nope", Name: "x"})}}}},
		{"a frame for another actor", &paremote.MessageBatch{TypeNames: []string{bytesType},
			Targets:   []*paactor.PID{{Address: node.addr, Id: "EndpointSupervisor"}},
			Envelopes: []*paremote.MessageEnvelope{{MessageData: frame}}}},
	}
	connect := func() paremote.Remoting_ReceiveClient {
		// A bound far beyond the cut, which comes at once: a stream not cut fails the
		// test rather than hang it.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		stream, err := client.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = stream.Send(&paremote.RemoteMessage{MessageType: &paremote.RemoteMessage_ConnectRequest{
			ConnectRequest: &paremote.ConnectRequest{ConnectionType: &paremote.ConnectRequest_ServerConnection{
				ServerConnection: &paremote.ServerConnection{SystemId: "hostile", Address: "127.0.0.1:1"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("connect: %v", err)
		}
		return stream
	}
	for _, c := range refused {
		stream := connect()
		if err := stream.Send(&paremote.RemoteMessage{MessageType: &paremote.RemoteMessage_MessageBatch{MessageBatch: c.batch}}); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if _, err := stream.Recv(); err == nil || status.Code(err) == codes.DeadlineExceeded {
			t.Errorf("%s: the stream was not cut (%v)", c.what, err)
		}
		select {
		case <-node.exit:
			t.Fatalf("%s: the node exited", c.what)
		default:
		}
	}
	// Frames the guard lets through, for the agent, that do not decode or mean nothing: the
	// agent drops them.
	var junk [][]byte
	rnd := mrand.New(mrand.NewPCG(1, 2))
	for range 64 {
		b := make([]byte, rnd.IntN(256))
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		junk = append(junk, b)
	}
	valid := [][]byte{
		remote.AppendOpen(remote.AppendHeader(nil, remote.KindOpen, remote.Session{1}, 0, 0), &remote.Open{Reply: "127.0.0.1:1", ReplyActor: "nope"}),
		remote.AppendHeader(nil, remote.KindCalls, remote.Session{2}, 0, 0),
		remote.AppendHeader(nil, remote.KindResults, remote.Session{3}, 0, 0),
		remote.AppendHeader(nil, remote.KindBye, remote.Session{4}, 0, 0),
	}
	for _, v := range valid {
		junk = append(junk, v)
		for range 16 { // and mutations of it
			m := append([]byte(nil), v...)
			m[rnd.IntN(len(m))] ^= byte(1 + rnd.IntN(255))
			junk = append(junk, m[:rnd.IntN(len(m)+1)])
		}
	}
	stream := connect()
	for _, j := range junk {
		batch := &paremote.MessageBatch{TypeNames: []string{bytesType}, Targets: []*paactor.PID{agent},
			Envelopes: []*paremote.MessageEnvelope{{MessageData: marshal(wrapperspb.Bytes(j))}}}
		if err := stream.Send(&paremote.RemoteMessage{MessageType: &paremote.RemoteMessage_MessageBatch{MessageBatch: batch}}); err != nil {
			t.Fatalf("junk frames: %v", err)
		}
	}
	_ = stream.CloseSend()
	if _, err := client.ListProcesses(context.Background(), &paremote.ListProcessesRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("ListProcesses: %v, want Unimplemented", err)
	}
	raw, err := net.Dial("tcp", node.addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = raw.Write(junk[0])
	_, _ = raw.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	raw.Close()
	// The node is alive, and serves a pool.
	p := remotePool(t, knit.Config{Lanes: 2}, []*testNode{node})
	addConcurrentlyRemote(t, p, 200)
	select {
	case <-node.exit:
		t.Fatal("the node exited")
	default:
	}
}

// remoteHang ignores its context: only a kill ends it.
var remoteHang = knit.Define("test.remote.hang", func(context.Context, int) (int, error) {
	time.Sleep(time.Hour)
	return 0, nil
}, knit.HardTimeout(300*time.Millisecond))

// TestRemoteLaneLife: a remote lane's life as a local one's: a call whose caller gives up is
// cancelled on its node (the lane is free again), a hard timeout kills the lane on its node
// (WORKER_CRASHED) and it restarts, recycles (MaxCallsPerLane) lose no call, and Resize adds
// and removes lanes.
// TestRemoteMapChunkLaneCrash: when a node's lane process dies running a Map chunk, the
// node reports how many of the chunk's elements had started (Ended.Began), and only those
// fail; the rest run again, as on a pool's own process lanes.
func TestRemoteMapChunkLaneCrash(t *testing.T) {
	nodes := startNodes(t, 1)
	mapCrashIsPrecise(t, 200, 13, func(task *knit.Task[int, int]) *knit.Pool {
		return remotePool(t, knit.Config{Lanes: 2}, nodes, task)
	})
}

func TestRemoteLaneLife(t *testing.T) {
	nodes := startNodes(t, 2)
	rec := newRecorder()
	p := remotePool(t, knit.Config{Lanes: 1, MaxCallsPerLane: 150, OnEvent: rec.record}, nodes, add, sleepy, remoteHang)
	ctx, cancel := context.WithCancel(context.Background())
	fut := sleepy.Go(ctx, p, 0)
	for p.Stats().Lanes[0].InFlight == 0 {
		runtime.Gosched() // the call is on its way to the lane
	}
	cancel()
	if _, err := fut.Wait(); !errors.Is(err, knit.ErrCanceled) {
		t.Errorf("a cancelled call: %v", err)
	}
	// One lane: it answers only once the cancelled task has ended on its node.
	if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
		t.Fatalf("after a cancelled call: %d, %v", sum, err)
	}

	mark := rec.mark()
	if _, err := remoteHang.Call(context.Background(), p, 0); !errors.Is(err, knit.ErrTimeout) {
		t.Errorf("a call past its hard timeout: %v", err)
	}
	e := rec.awaitFrom(t, mark, "lane 0 killed for the hard timeout", func(e knit.Event) bool {
		return e.Lane == 0 && e.To == knit.StateCrashed
	})
	if e.Code != knit.CodeWorkerCrashed || !strings.Contains(e.Reason, "hard timeout") {
		t.Errorf("lane 0 ended %s: %s", e.Code, e.Reason)
	}
	rec.awaitFrom(t, mark, "lane 0 back", func(e knit.Event) bool { return e.Lane == 0 && e.To == knit.StateReady })

	mark = rec.mark()
	addConcurrentlyRemote(t, p, 600) // 150 calls a lane incarnation: recycled on the way
	rec.awaitFrom(t, mark, "a recycle", func(e knit.Event) bool { return e.Lane == 0 && e.To == knit.StateRecycling })

	if err := p.Resize(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	addConcurrentlyRemote(t, p, 200)
	if where := placed(t, p, rec, 4); where[nodes[0].addr] != 2 || where[nodes[1].addr] != 2 {
		t.Errorf("lanes per node after growing to 4: %v", where)
	}
	if err := p.Resize(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	addConcurrentlyRemote(t, p, 100)
}

// TestRemotePackedLaneCrash: a node's lane process dies running a chunk of packed calls (the
// test nodes pack whatever the pace). Every call settles; the ones that fail had started (the
// call that crashed the lane, and, unless Idempotent, those packed before it, whose results
// died with the lane) and fail WORKER_CRASHED or POISON_CALL; no call sent after the crash
// fails (it had not started: it runs elsewhere); with Idempotent only the crashing call fails.
func TestRemotePackedLaneCrash(t *testing.T) {
	nodes := startNodes(t, 2)
	ctx := context.Background()
	for k, task := range []*knit.Task[int, int]{mapCrash, mapCrashIdempotent} {
		p := remotePool(t, knit.Config{Lanes: 2}, nodes[k:k+1], task)
		// The node learns the task's pace from a call of its own.
		if v, err := task.Call(ctx, p, 14); err != nil || v != 14*14 {
			t.Fatalf("%s: %d, %v", task.Name(), v, err)
		}
		const n, at = 400, 200
		futs := make([]*knit.Future[int], n)
		for i := range futs {
			x := i + 14
			if i == at {
				x = 13 // crashes its lane
			}
			futs[i] = task.Go(ctx, p, x)
		}
		var failed []int
		for i, f := range futs {
			v, err := f.Wait()
			if err == nil {
				if x := i + 14; v != x*x {
					t.Errorf("%s: call %d: %d, want %d", task.Name(), i, v, x*x)
				}
				continue
			}
			var ke *knit.Error
			if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed && ke.Code != knit.CodePoisonCall || !ke.Started {
				t.Errorf("%s: call %d: %v", task.Name(), i, err)
			}
			failed = append(failed, i)
		}
		switch {
		case len(failed) == 0 || failed[len(failed)-1] != at:
			t.Errorf("%s: failed %v, want the calls up to %d", task.Name(), failed, at)
		case task == mapCrashIdempotent && len(failed) != 1:
			t.Errorf("%s: failed %v, want %d alone", task.Name(), failed, at)
		}
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if l := nodes[k].await(`"host session ended"`); strings.Contains(l, `"chunks_packed":0`) {
			t.Errorf("%s: the node packed no call: %s", task.Name(), l)
		}
	}
}
