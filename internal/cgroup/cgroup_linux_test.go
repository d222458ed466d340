//go:build linux

package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup1"
)

var testSeq int

// open opens a tree for a test, or skips it, saying why, where the machine cannot give one.
func open(t *testing.T, v Version, l Limits) *Tree {
	t.Helper()
	testSeq++
	tree, err := Open(fmt.Sprintf("knit-test-%d-%d", os.Getpid(), testSeq), Options{Version: v}, l)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("%v with %+v unavailable on this machine: %v", v, l, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tree.Close(); err != nil {
			t.Error(err)
		}
		assertGone(t, tree)
	})
	return tree
}

// dirs are the tree's directories: one per hierarchy in v1.
func dirs(t *testing.T, tree *Tree) []string {
	t.Helper()
	if tree.version == V2 {
		return []string{tree.dir2}
	}
	subs, _ := tree.hier()
	var out []string
	for _, s := range subs {
		d, err := dirV1(tree.hier, tree.path1, s.Name())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

func assertGone(t *testing.T, tree *Tree) {
	t.Helper()
	for _, d := range dirs(t, tree) {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup directory %s left behind (%v)", d, err)
		}
	}
}

// start starts sh running script in group g: born there on v2, moved there before it reads
// its first line of input on v1. It returns the first line the script prints.
func start(t *testing.T, g *Group, script string, env ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "read go; "+script)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	dir, err := g.Dir()
	if err != nil {
		t.Fatal(err)
	}
	if dir != nil {
		defer dir.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(dir.Fd())
	}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if dir == nil {
		if err := g.Add(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	io.WriteString(in, "go\n")
	line, _ := bufio.NewReader(out).ReadString('\n')
	return cmd, strings.TrimSpace(line)
}

// gone reports whether pid has ended: no such process, or a zombie nobody reaped yet.
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

// testKillsDescendants: a grandchild that called setsid (its own session and process group,
// so a process-group kill misses it) is in the lane's cgroup, and dies with it.
func testKillsDescendants(t *testing.T, tree *Tree) {
	g, err := tree.New()
	if err != nil {
		t.Fatal(err)
	}
	_, line := start(t, g, "setsid sleep 1000 & echo $!; wait")
	pid, err := strconv.Atoi(line)
	if err != nil {
		t.Fatalf("no pid from the script: %q", line)
	}
	pids, err := g.Pids()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range pids {
		found = found || p == pid
	}
	if !found {
		t.Fatalf("setsid grandchild %d not in the cgroup (%v)", pid, pids)
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	// Kill returns once cgroup.procs is empty: the grandchild has exited by then.
	if !gone(pid) {
		t.Fatalf("setsid grandchild %d outlived the cgroup's kill", pid)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs(t, tree) {
		if _, err := os.Stat(filepath.Join(d, g.name)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("group directory left in %s (%v)", d, err)
		}
	}
}

func TestV1KillsDescendants(t *testing.T) {
	testKillsDescendants(t, open(t, V1, Limits{Memory: 64 << 20, Pids: 64, CPUQuota: 50000}))
}

func TestV2KillsDescendants(t *testing.T) {
	testKillsDescendants(t, open(t, V2, Limits{}))
}

func TestV2Limits(t *testing.T) {
	testKillsDescendants(t, open(t, V2, Limits{Memory: 64 << 20, Pids: 64, CPUQuota: 50000}))
}

// TestV1Limits: the limits are written where the kernel enforces them.
func TestV1Limits(t *testing.T) {
	tree := open(t, V1, Limits{Memory: 64 << 20, Pids: 64, CPUQuota: 50000})
	g, err := tree.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		n          cgroup1.Name
		file, want string
	}{
		{cgroup1.Memory, "memory.limit_in_bytes", "67108864"},
		{cgroup1.Pids, "pids.max", "64"},
		{cgroup1.Cpu, "cpu.cfs_quota_us", "50000"},
		{cgroup1.Cpu, "cpu.cfs_period_us", "100000"},
	} {
		d, err := dirV1(tree.hier, g.path1, c.n)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(d, c.file))
		if err != nil || strings.TrimSpace(string(b)) != c.want {
			t.Errorf("%s: %q, %v; want %s", c.file, b, err, c.want)
		}
	}
}

// TestOOMKills: a process allocating past the group's memory limit is killed by the kernel,
// and the group's counter says so.
func TestOOMKills(t *testing.T) {
	for _, v := range []Version{V1, V2} {
		t.Run(v.String(), func(t *testing.T) {
			tree := open(t, v, Limits{Memory: 32 << 20})
			g, err := tree.New()
			if err != nil {
				t.Fatal(err)
			}
			if n := g.OOMKills(); n != 0 {
				t.Fatalf("a new group counts %d OOM kills", n)
			}
			cmd, _ := start(t, g, "echo started; exec "+os.Args[0]+" -test.run=^$", envAlloc+"=1")
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("allocating past the limit: %v, want killed by SIGKILL", err)
			}
			if n := g.OOMKills(); n == 0 {
				t.Fatal("the group counts no OOM kill")
			}
		})
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	tree := open(t, Auto, Limits{Pids: 64})
	var pids []int
	for range 2 {
		g, err := tree.New()
		if err != nil {
			t.Fatal(err)
		}
		_, line := start(t, g, "setsid sleep 1000 & echo $!; wait")
		pid, _ := strconv.Atoi(line)
		pids = append(pids, pid)
	}
	if err := tree.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if !gone(pid) {
			t.Errorf("pid %d outlived Close", pid)
		}
	}
	assertGone(t, tree)
	if _, err := tree.New(); err == nil {
		t.Fatal("New after Close succeeded")
	}
}

// TestOpenNeedsItsParent: a parent that does not exist is a reason to fall back, not a path
// to make (nobody would remove it).
func TestOpenNeedsItsParent(t *testing.T) {
	for _, v := range []Version{V1, V2} {
		_, err := Open("knit-test-parent", Options{Version: v, Parent: "/knit-no-such-parent/x"}, Limits{})
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("%v: %v, want ErrUnavailable", v, err)
		}
		for _, root := range []string{"/sys/fs/cgroup/*", "/sys/fs/cgroup"} {
			if m, _ := filepath.Glob(filepath.Join(root, "knit-no-such-parent")); len(m) > 0 {
				t.Fatalf("%v: Open made %v", v, m)
			}
		}
	}
}

func TestOpenRefusesBadNames(t *testing.T) {
	for _, n := range []string{"", ".", "..", "a/b", "x\x00"} {
		if _, err := Open(n, Options{}, Limits{}); err == nil || errors.Is(err, ErrUnavailable) {
			t.Errorf("Open(%q): %v", n, err)
		}
	}
}

func TestParseKV(t *testing.T) {
	text := "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
	if n, ok := parseKV(text, "oom_kill"); !ok || n != 2 {
		t.Fatalf("oom_kill: %d %v", n, ok)
	}
	if _, ok := parseKV("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"); ok {
		t.Fatal("found oom_kill where there is none")
	}
	if n, ok := parseKV("oom_kill_disable 0\nunder_oom 0\noom_kill 7", "oom_kill"); !ok || n != 7 {
		t.Fatalf("v1 oom_control: %d %v", n, ok)
	}
}

// deadPid is the pid of a process that has ended and been reaped.
func deadPid(t *testing.T) int {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestSweep: the pool directory of a host that died, with a process still in it, goes at the
// next Sweep; this living host's stays.
func TestSweep(t *testing.T) {
	for _, v := range []Version{V1, V2} {
		t.Run(v.String(), func(t *testing.T) {
			dead, err := Open(fmt.Sprintf("knit-%d-1", deadPid(t)), Options{Version: v}, Limits{})
			if errors.Is(err, ErrUnavailable) {
				t.Skipf("%v unavailable: %v", v, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = dead.Close() }) // should the sweep fail
			g, err := dead.New()
			if err != nil {
				t.Fatal(err)
			}
			_, line := start(t, g, "setsid sleep 1000 & echo $!; wait")
			pid, _ := strconv.Atoi(line)
			own, err := Open(fmt.Sprintf("knit-%d-999", os.Getpid()), Options{Version: v}, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()

			removed, err := Sweep(Options{Version: v})
			if err != nil {
				t.Fatal(err)
			}
			// Others may go too: groups another dead host left on this machine.
			if !slices.ContainsFunc(removed, func(r string) bool { return strings.Contains(r, dead.Name()) }) {
				t.Fatalf("Sweep removed %v, want %s", removed, dead.Name())
			}
			for _, r := range removed {
				if strings.Contains(r, own.Name()) {
					t.Fatalf("Sweep removed this process's own %s", r)
				}
			}
			if !gone(pid) {
				t.Fatalf("process %d in the dead host's cgroup survived the sweep", pid)
			}
			assertGone(t, dead)
			for _, d := range dirs(t, own) {
				if _, err := os.Stat(d); err != nil {
					t.Fatalf("this process's own pool directory went: %v", err)
				}
			}
		})
	}
}

// escape starts, in group g, two setsid processes that leave it: one for a cgroup it makes
// inside g, one for a cgroup it makes beside g in the pool's directory, in every hierarchy
// (a lane's children can, where they may write the cgroup filesystem). It returns their pids
// once both have moved.
func escape(t *testing.T, tree *Tree, g *Group) []int {
	t.Helper()
	script := `for d in $LANE_DIRS; do mkdir "$d/inner" "$d/../stray" || exit 1; done
for where in inner ../stray; do
	WHERE=$where setsid sh -c 'for d in $LANE_DIRS; do echo $$ > "$d/$WHERE/cgroup.procs" || exit 1; done; echo "moved $$"; exec sleep 1000' &
done
wait`
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = append(os.Environ(), "LANE_DIRS="+strings.Join(g.dirs(), " "))
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	dir, err := g.Dir()
	if err != nil {
		t.Fatal(err)
	}
	if dir != nil {
		defer dir.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(dir.Fd())
	}
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	// On v1 the script starts outside g and is moved in before it may run: it waits for
	// its standard input to close.
	in, _ := cmd.StdinPipe()
	cmd.Args = []string{"sh", "-c", "read -r _; " + script}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if dir == nil {
		if err := g.Add(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	in.Close()
	sc := bufio.NewScanner(out)
	var pids []int
	for len(pids) < 2 && sc.Scan() {
		pid, err := strconv.Atoi(strings.TrimPrefix(sc.Text(), "moved "))
		if err != nil {
			t.Fatalf("escaping script said %q", sc.Text())
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // should the test fail
		pids = append(pids, pid)
	}
	if len(pids) < 2 {
		t.Fatalf("the escaping processes did not move (%v)", sc.Err())
	}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if strings.Contains(line, tree.Name()) && !strings.HasSuffix(line, "/inner") && !strings.HasSuffix(line, "/stray") {
				t.Fatalf("process %d is still in its lane's group: %s", pid, line)
			}
		}
	}
	return pids
}

// TestCloseKillsEscapees: processes that left their lane's group for a cgroup they made
// inside it or beside it die at Close, and every directory goes.
func TestCloseKillsEscapees(t *testing.T) {
	for _, v := range []Version{V1, V2} {
		t.Run(v.String(), func(t *testing.T) {
			tree := open(t, v, Limits{})
			g, err := tree.New()
			if err != nil {
				t.Fatal(err)
			}
			pids := escape(t, tree, g)
			if err := tree.Close(); err != nil {
				t.Fatal(err)
			}
			for _, pid := range pids {
				if !gone(pid) {
					t.Errorf("pid %d, which left its group, outlived Close", pid)
				}
			}
			assertGone(t, tree)
		})
	}
}

// TestRemoveKillsBeneath: a lane's group goes with the cgroups made inside it and what runs
// there; what left for a cgroup beside it waits for Close.
func TestRemoveKillsBeneath(t *testing.T) {
	for _, v := range []Version{V1, V2} {
		t.Run(v.String(), func(t *testing.T) {
			tree := open(t, v, Limits{})
			g, err := tree.New()
			if err != nil {
				t.Fatal(err)
			}
			pids := escape(t, tree, g) // [inner, stray] in some order
			if err := g.Remove(); err != nil {
				t.Fatal(err)
			}
			var alive []int
			for _, pid := range pids {
				if !gone(pid) {
					alive = append(alive, pid)
				}
			}
			if len(alive) != 1 {
				t.Fatalf("alive after the group's removal: %v of %v, want only the one beside it", alive, pids)
			}
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", alive[0]))
			if !strings.Contains(string(b), "/stray") {
				t.Fatalf("the survivor %d is not the one beside the group: %s", alive[0], b)
			}
			for _, d := range g.dirs() {
				if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("group directory %s left (%v)", d, err)
				}
			}
		})
	}
}
