package knit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
)

// A lane, or a child of it in a session of its own, tries to leave its cgroup for one it
// makes beside it in the pool's directory (issue 29).

// laneCgroupDirs are the directories of this process's knit cgroup, one per hierarchy.
func laneCgroupDirs() ([]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], "/knit-") {
			continue
		}
		// v1: mounted at /sys/fs/cgroup/<controllers>; v2 (no controllers listed): the
		// unified mount, or its place on a hybrid host.
		roots := []string{filepath.Join("/sys/fs/cgroup", parts[1])}
		if parts[1] == "" {
			roots = []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}
		}
		for _, r := range roots {
			if d := filepath.Join(r, parts[2]); isDir(d) {
				dirs = append(dirs, d)
				break
			}
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no knit cgroup in %q", b)
	}
	return dirs, nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// escapeScript makes, for each of its arguments (a lane cgroup's directory), a cgroup beside
// it and moves itself there; it prints "escaped" if it could everywhere, "refused"
// otherwise, and sleeps.
const escapeScript = `r=escaped
for d in "$@"; do
	if ! mkdir "$d/../escape.$$" 2>/dev/null || ! (echo $$ > "$d/../escape.$$/cgroup.procs") 2>/dev/null; then r=refused; fi
done
echo "$r"
exec sleep 1000`

// leaveCgroup, with child set, starts escapeScript in a session of its own (out of the
// lane's process group) and returns "<pid> <what it printed>"; without, the lane itself
// tries: it returns the errno of its first refused step, or "ok".
var leaveCgroup = knit.Define("test.cgroup.leave", func(_ context.Context, child bool) (string, error) {
	dirs, err := laneCgroupDirs()
	if err != nil {
		return "", err
	}
	if !child {
		for _, d := range dirs {
			esc := filepath.Join(filepath.Dir(d), "escape."+strconv.Itoa(os.Getpid()))
			if err := unix.Mkdir(esc, 0o755); err != nil {
				return errnoOf(err), nil
			}
			if err := os.WriteFile(filepath.Join(esc, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
				return errnoOf(err), nil
			}
		}
		return "ok", nil
	}
	cmd := exec.Command("sh", append([]string{"-c", escapeScript, "sh"}, dirs...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("escaping child: %w", err)
	}
	return strconv.Itoa(cmd.Process.Pid) + " " + strings.TrimSpace(line), nil
})

// newCgroupPool starts a pool of one process lane in a cgroup, or skips, saying why, where
// the machine gives none (except under CI, where it fails).
func newCgroupPool(t *testing.T, sb knit.Sandbox) *knit.Pool {
	t.Helper()
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{
		Sandbox: sb,
		Limits:  knit.Limits{Memory: 128 << 20, Processes: 64, Cgroup: knit.CgroupRequired},
	}}, leaveCgroup, add)
	if err != nil && strings.Contains(err.Error(), "cgroups unavailable") && os.Getenv("CI") != "true" {
		t.Skipf("this machine gives no cgroups: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// cgroupOf is process pid's /proc/<pid>/cgroup.
func cgroupOf(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return string(b)
}

// startEscaper has the lane start escapeScript and returns its pid and what it printed.
func startEscaper(t *testing.T, p *knit.Pool) (int, string) {
	t.Helper()
	got, err := leaveCgroup.Call(context.Background(), p, true)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(got)
	pid, err := strconv.Atoi(f[0])
	if err != nil || len(f) != 2 {
		t.Fatalf("the lane said %q", got)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // should the test fail
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Fatalf("the child is not in a session of its own: sid %d, %v", sid, err)
	}
	return pid, f[1]
}

// TestCgroupEscapeDiesAtClose: unsandboxed, a lane running as root may make cgroups beside
// its own and move a child there (a lane of another user, in a delegated hierarchy, too):
// the child still dies at Close, and no directory is left.
func TestCgroupEscapeDiesAtClose(t *testing.T) {
	p := newCgroupPool(t, knit.Sandbox{})
	pid, said := startEscaper(t, p)
	if os.Geteuid() == 0 && said != "escaped" {
		t.Fatalf("an unsandboxed root lane's child could not leave its cgroup (%s): the test needs it to", said)
	}
	t.Logf("the child %s: %s", said, strings.ReplaceAll(cgroupOf(pid), "\n", " "))
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid, "Close")
	if left := knitCgroups(t, os.Getpid()); len(left) > 0 {
		t.Fatalf("cgroup directories left after Close: %v", left)
	}
}

// TestCgroupSandboxedCannotLeave: under Landlock (even reading all of /) a lane's child
// cannot write the cgroup filesystem; under the seccomp preset, which lets the lane start
// no child, the lane itself cannot (its process scope denies writes beneath /sys). Each
// stays in its cgroup and dies at Close.
func TestCgroupSandboxedCannotLeave(t *testing.T) {
	t.Run("landlock, a setsid child", func(t *testing.T) {
		needLandlock(t)
		// os/exec opens /dev/null for the child's missing standard input, read-write.
		p := newCgroupPool(t, knit.Sandbox{Landlock: knit.Landlock{Mode: knit.SandboxRequired,
			ReadOnly: []string{"/"}, Writable: []string{os.DevNull}}})
		pid, said := startEscaper(t, p)
		if said != "refused" || strings.Contains(cgroupOf(pid), "/escape.") {
			t.Fatalf("the child %s: %s", said, cgroupOf(pid))
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid, "Close")
	})
	t.Run("seccomp, the lane", func(t *testing.T) {
		needScope(t)
		p := newCgroupPool(t, knit.Sandbox{Seccomp: knit.Seccomp{Mode: knit.SandboxRequired}})
		lane := p.Stats().Lanes[0].PID
		got, err := leaveCgroup.Call(context.Background(), p, false)
		if err != nil || got != "EACCES" {
			t.Fatalf("the lane leaving its cgroup: %q, %v; want EACCES", got, err)
		}
		if strings.Contains(cgroupOf(lane), "/escape.") {
			t.Fatalf("the lane left its cgroup: %s", cgroupOf(lane))
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if left := knitCgroups(t, os.Getpid()); len(left) > 0 {
			t.Fatalf("cgroup directories left after Close: %v", left)
		}
	})
}

// TestCgroupDefaultConfig: with the default Config, where the host can make a cgroup, each
// lane gets one with no limit, so that a grandchild in a session of its own dies with its
// lane. It skips (fails under CI) where the pool gave its lane none.
func TestCgroupDefaultConfig(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet()}, startSetsid, exit3, add)
	lane := p.Stats().Lanes[0].PID
	if !strings.Contains(cgroupOf(lane), fmt.Sprintf("/knit-%d-", os.Getpid())) {
		msg := fmt.Sprintf("the default Config gave lane %d no cgroup: %s", lane, strings.ReplaceAll(cgroupOf(lane), "\n", " "))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	pid, err := startSetsid.Call(context.Background(), p, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL) // should the test fail
	if _, err := exit3.Call(context.Background(), p, 3); !errors.Is(err, knit.ErrWorkerExited) {
		t.Fatalf("exit(3): %v", err)
	}
	waitGone(t, pid, "its lane's exit")
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := knitCgroups(t, os.Getpid()); len(left) > 0 {
		t.Fatalf("cgroup directories left after Close: %v", left)
	}
}
