package lifecycle

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestLaneEnv: a lane's environment is scrubbed to KNIT_* (but not the boot protocol's own
// variables), PATH, GORACE and what Env allows, and marks the process a lane.
func TestLaneEnv(t *testing.T) {
	t.Setenv("KNIT_DEBUG", "lane")
	t.Setenv(EnvBoot, "{}")
	t.Setenv(EnvSpare, "1")
	t.Setenv("SECRET", "s")
	t.Setenv("ALLOWED", "a")
	t.Setenv("PATH", "/host/bin")
	t.Setenv("GORACE", "halt_on_error=1")
	env := laneEnv([]string{"ALLOWED", "SET=x", "UNSET_NAME"})
	for _, want := range []string{"KNIT_DEBUG=lane", "PATH=/host/bin", "GORACE=halt_on_error=1", "ALLOWED=a", "SET=x", EnvLane + "=1"} {
		if !slices.Contains(env, want) {
			t.Errorf("environment lacks %s: %q", want, env)
		}
	}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if name == "SECRET" || name == EnvBoot || name == EnvSpare || name == "UNSET_NAME" {
			t.Errorf("environment passes %s: %q", kv, env)
		}
	}
	if env[len(env)-1] != EnvLane+"=1" {
		t.Errorf("environment ends with %q, want %s=1 last", env[len(env)-1], EnvLane)
	}
	env = laneEnv([]string{"PATH=/lane/bin"})
	if slices.Contains(env, "PATH=/host/bin") || !slices.Contains(env, "PATH=/lane/bin") {
		t.Errorf("an allowed PATH does not replace the host's: %q", env)
	}
}

// launcher is a Launcher of command (run by sh -c) whose lane output goes to an observer.
func launcher(t *testing.T, command string) (*Launcher, *observer.ObservedLogs) {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skipf("no sh: %v", err)
	}
	core, logs := observer.New(zap.DebugLevel)
	log := zap.New(core)
	return &Launcher{Command: []string{"sh", "-c", command}, StartupTimeout: time.Minute, Root: log, Log: log}, logs
}

// TestProcessExit: Wait and Collect report how a lane process ended: its status, its stderr
// tail; its stdout is relayed.
func TestProcessExit(t *testing.T) {
	lc, logs := launcher(t, `echo out; echo "knit lane: broken" >&2; exit 3`)
	p, err := lc.Start(Boot{Lane: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.PID() <= 0 {
		t.Errorf("PID %d", p.PID())
	}
	x := p.Wait()
	p.Collect(&x)
	<-p.output.relayed
	if x.Status != 3 || x.Signal != 0 || x.Err != nil || !slices.Equal(x.Tail, []string{"knit lane: broken"}) {
		t.Fatalf("exit %+v", x)
	}
	if l := logs.FilterMessage("lane stdout").All(); len(l) != 1 || l[0].ContextMap()["line"] != "out" || l[0].ContextMap()["lane"] != int64(2) {
		t.Fatalf("stdout relayed as %v", l)
	}
}

// TestProcessKill: the first reason the host gives for a kill is the one reported, and the
// Killed hook hears it once, with the lane.
func TestProcessKill(t *testing.T) {
	lc, _ := launcher(t, "exec sleep 60")
	var heard []Exit
	var lanes []int
	lc.Killed = func(lane int, why Exit) { heard, lanes = append(heard, why), append(lanes, lane) }
	p, err := lc.Start(Boot{Lane: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	corrupt := errors.New("corrupt")
	p.Kill(Exit{Corrupt: corrupt})
	p.Kill(Exit{Unresponsive: "later"})
	x := p.Wait()
	p.Collect(&x)
	if x.Signal != syscall.SIGKILL || x.Corrupt != corrupt || x.Unresponsive != "" || p.Killed().Corrupt != corrupt {
		t.Fatalf("exit %+v", x)
	}
	if len(heard) != 1 || heard[0].Corrupt != corrupt || lanes[0] != 1 {
		t.Fatalf("Killed heard %v for lanes %v", heard, lanes)
	}
}

// TestProcessHandoffFails: with Named, a lane process that never collects its descriptors is
// killed at the startup timeout, and the end says why.
func TestProcessHandoffFails(t *testing.T) {
	lc, _ := launcher(t, "exec sleep 60")
	lc.Named, lc.StartupTimeout = true, 50*time.Millisecond
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := lc.Start(Boot{Lane: 0}, []*os.File{f})
	if err != nil {
		t.Skipf("no rendezvous here: %v", err)
	}
	x := p.Wait()
	p.Collect(&x)
	if x.Handoff == nil || x.Signal != syscall.SIGKILL {
		t.Fatalf("exit %+v, want a failed hand-over and SIGKILL", x)
	}
	if _, err := os.Stat("/dev/shm/" + p.rv.Name()); !os.IsNotExist(err) {
		t.Errorf("rendezvous %s left behind: %v", p.rv.Name(), err)
	}
}

// TestStartFails: a command that cannot start fails Start with the spawn step named.
func TestStartFails(t *testing.T) {
	lc := &Launcher{Command: []string{"/nonexistent/knit-lane"}, Root: zap.NewNop(), Log: zap.NewNop()}
	if _, err := lc.Start(Boot{}, nil); err == nil || !strings.HasPrefix(err.Error(), "spawn /nonexistent/knit-lane: ") {
		t.Fatalf("Start: %v", err)
	}
}

// The zero Process has no process: Kill records why and signals nothing.
func TestZeroProcess(t *testing.T) {
	var p Process
	p.Kill(Exit{Unresponsive: "test"})
	if p.PID() != 0 || p.Killed().Unresponsive != "test" {
		t.Fatalf("pid %d, killed %+v", p.PID(), p.Killed())
	}
}
