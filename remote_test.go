package knit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit"
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
	if err := knit.ServeNode(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// testNode is a node process.
type testNode struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string

	mu    sync.Mutex
	lines []string
	more  chan struct{}
	exit  chan struct{}
}

// startNode starts a node listening on addr ("127.0.0.1:0": a free port), with env added,
// and waits until it serves. The test's cleanup kills it.
func startNode(t *testing.T, addr string, env ...string) *testNode {
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

func startNodes(t *testing.T, n int, env ...string) []*testNode {
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

func remotePool(t *testing.T, cfg knit.Config, nodes []*testNode, tasks ...knit.Definition) *knit.Pool {
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
