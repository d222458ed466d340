package knit_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/internal/shm"
)

// Strangers at a lane's rendezvous (SharedMemory Named, issue 29): whoever connects first,
// only the lane gets its region, and the host waits for it.

// gatedPrefix is a Prefix that prints "spawned" (the rendezvous exists by then: it is made
// before the lane is spawned) and starts the lane only once a line can be read from the
// FIFO fifo: a test connects to the rendezvous meanwhile.
func gatedPrefix(t *testing.T) (prefix []string, open func()) {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "gate")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	open = func() {
		once.Do(func() {
			f, err := os.OpenFile(fifo, os.O_WRONLY, 0) // blocks until the prefix reads
			if err != nil {
				t.Error(err)
				return
			}
			f.WriteString("go\n")
			f.Close()
		})
	}
	return []string{"sh", "-c", `echo spawned; read -r _ < "$0"; exec "$@"`, fifo}, open
}

// TestNamedStrangerConnectsFirst: a process that is not the lane (here the test itself)
// connects to a lane's rendezvous before the lane does, with a key of its own making. It
// receives nothing, the host logs the refusal at Warn, and the lane, connecting after, gets
// its region: NewPool succeeds and the pool serves.
func TestNamedStrangerConnectsFirst(t *testing.T) {
	spawned, refusedCh := make(chan struct{}), make(chan struct{})
	var once, refusedOnce sync.Once
	// Hooks run after the observer core has kept the entry.
	hook := zap.Hooks(func(e zapcore.Entry) error {
		switch {
		case e.Message == "lane stdout":
			once.Do(func() { close(spawned) })
		case strings.Contains(e.Message, "refused a peer"):
			refusedOnce.Do(func() { close(refusedCh) })
		}
		return nil
	})
	core, logs := observer.New(zap.WarnLevel)
	prefix, release := gatedPrefix(t)
	type result struct {
		p   *knit.Pool
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: zap.New(zapcore.NewTee(core, observerCore()), hook),
			Process: knit.ProcessConfig{SharedMemory: knit.Named, Spares: -1, Prefix: prefix}}, add)
		done <- result{p, err}
	}()
	defer release() // should the test fail before: NewPool's lane must not wait for ever
	<-spawned
	names := shmNames(t)
	if len(names) != 1 {
		t.Fatalf("rendezvous names %v, want one", names)
	}
	if files, err := shm.Collect(filepath.Base(names[0]), strings.Repeat("5a", 32), 2); err == nil {
		for _, f := range files {
			f.Close()
		}
		t.Fatal("a stranger collected the lane's region")
	}
	select {
	case <-refusedCh:
	case r := <-done:
		t.Fatalf("NewPool returned before the refusal was logged: %v", r.err)
	}
	refusal := logs.FilterMessageSnippet("refused a peer").All()[0].ContextMap()
	if refusal["peer_pid"] != int64(os.Getpid()) || !strings.Contains(fmt.Sprint(refusal["error"]), "not lane process") {
		t.Fatalf("the refusal logged %v", refusal)
	}
	release()
	r := <-done
	if r.err != nil {
		t.Fatalf("NewPool after a stranger was refused: %v", r.err)
	}
	if sum, err := add.Call(context.Background(), r.p, [2]int64{40, 2}); err != nil || sum != 42 {
		t.Fatalf("call: %d, %v", sum, err)
	}
	if err := r.p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t)
}

// TestHelperNamedNamespaceHost is not a test: TestNamedStrangerOutsidePidNamespace runs the
// test binary as a host in a pid namespace of its own, with one Named lane behind
// gatedPrefix's script (the FIFO's path in KNIT_TEST_GATE). It prints its log (JSON, Info and
// up), then "served <sum>" and "closed: <error>".
func TestHelperNamedNamespaceHost(t *testing.T) {
	fifo := os.Getenv("KNIT_TEST_GATE")
	if fifo == "" {
		t.Skip("helper process only")
	}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(os.Stdout), zap.InfoLevel))
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: log, Process: knit.ProcessConfig{
		SharedMemory: knit.Named, Spares: -1,
		Prefix: []string{"sh", "-c", `echo spawned; read -r _ < "$0"; exec "$@"`, fifo},
		// A host in a pid namespace of its own cannot tell other hosts' cgroups from dead
		// ones' (their pids mean nothing here): it must not sweep them.
		Limits: knit.Limits{Cgroup: knit.CgroupOff},
	}}, add)
	if err != nil {
		fmt.Println("NewPool:", err)
		return
	}
	sum, err := add.Call(context.Background(), p, [2]int64{40, 2})
	fmt.Println("served", sum, err)
	fmt.Println("closed:", p.Close(context.Background()))
}

// bootOf reads the boot record from process pid's environment (as root can: the stranger
// below may read the key of every process it can see).
func bootOf(pid int) (name, key string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return "", "", false
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, found := strings.CutPrefix(kv, "KNIT_BOOT="); found {
			var rec struct {
				Shm    string `json:"shm"`
				ShmKey string `json:"shm_key"`
			}
			if json.Unmarshal([]byte(v), &rec) == nil && rec.Shm != "" {
				return rec.Shm, rec.ShmKey, true
			}
		}
	}
	return "", "", false
}

// descendants lists the processes below pid.
func descendants(pid int) []int {
	parent := map[int]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		me, _ := strconv.Atoi(strings.Split(s, "/")[2])
		if len(f) > 1 {
			parent[me], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// TestNamedStrangerOutsidePidNamespace is issue 29's case: the host runs in a pid namespace
// of its own (a container sharing /dev/shm with others of its user) and a stranger outside
// it — this test — connects to its lane's rendezvous first, the kernel reporting its pid as
// 0. The stranger is refused even with the lane's key (which, as root in the parent
// namespace, it reads from the lane's environment), and without it; the lane, connecting
// after, is served.
func TestNamedStrangerOutsidePidNamespace(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err == nil {
		err = exec.Command(unshare, "--pid", "--fork", "--mount-proc", "true").Run()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("unshare --pid --mount-proc cannot run here: %v", err)
		}
		t.Skipf("unshare --pid --mount-proc cannot run here (needs util-linux, and root or user namespaces): %v", err)
	}
	fifo := filepath.Join(t.TempDir(), "gate")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// --mount-proc: the host's /proc must show its own pid namespace, which its peer check
	// walks.
	cmd := exec.Command(unshare, "--pid", "--fork", "--kill-child", "--mount-proc",
		exe, "-test.run=^TestHelperNamedNamespaceHost$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KNIT_TEST_GATE="+fifo)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	timeout := time.After(2 * time.Minute) // a regression fails instead of hanging
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the helper host ended before %s", what)
			}
			return l
		case <-timeout:
			t.Fatalf("the helper host said nothing of %s", what)
		}
		return ""
	}
	var said []string
	for l := next("its lane's spawn"); !strings.Contains(l, `"spawned"`); l = next("its lane's spawn") {
		said = append(said, l)
	}
	var name, key string
	for _, pid := range descendants(cmd.Process.Pid) {
		if n, k, ok := bootOf(pid); ok {
			name, key = n, k
		}
	}
	if name == "" || len(key) != 64 {
		t.Fatalf("no lane of the helper host carries a rendezvous (%q, %q)", name, key)
	}
	for _, k := range []string{strings.Repeat("5a", 32), key} {
		if files, err := shm.Collect(name, k, 2); err == nil {
			for _, f := range files {
				f.Close()
			}
			t.Fatalf("a stranger outside the host's pid namespace collected the lane's region (its key right: %v)", k == key)
		}
	}
	gate, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(gate, "go\n")
	gate.Close()
	refused := false
	for {
		l := next("serving")
		said = append(said, l)
		if strings.Contains(l, "refused a peer") && strings.Contains(l, `"peer_pid":0`) &&
			strings.Contains(l, "not visible here") {
			refused = true
		}
		if strings.HasPrefix(l, "served") || strings.HasPrefix(l, "NewPool:") {
			break
		}
	}
	if !strings.HasPrefix(said[len(said)-1], "served 42 <nil>") {
		t.Fatalf("the helper host:\n%s", strings.Join(said, "\n"))
	}
	if !refused {
		t.Errorf("the helper host logged no refusal of a peer with pid 0:\n%s", strings.Join(said, "\n"))
	}
	if l := next("Close"); l != "closed: <nil>" {
		t.Fatalf("the helper host: %s", l)
	}
}
