//go:build linux

package hostguard

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The child of TestRestore takes a snapshot, says so, waits until its parent has lowered
// its limits, restores them and reports what it found.
func hostChild() {
	s, err := Take()
	if err != nil {
		panic(err)
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		panic(err)
	}
	first := s.Restore()
	second := s.Restore() // nothing left to restore, or only what cannot be
	report := struct {
		First, Second []Change
		Errs          []string
	}{First: first, Second: second}
	for _, c := range first {
		msg := ""
		if c.Err != nil {
			msg = c.Err.Error()
		}
		report.Errs = append(report.Errs, msg)
	}
	b, _ := json.Marshal(report)
	fmt.Println(string(b))
}

// TestRestore: another process (the test, on its child) lowers the child's soft NOFILE and
// AS limits and its hard CPU and NOFILE limits; the child's Restore finds each, raises every
// soft limit back, and the hard ones only where it holds CAP_SYS_RESOURCE.
func TestRestore(t *testing.T) {
	if os.Getenv("KNIT_HOSTGUARD_CHILD") == "1" {
		hostChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRestore$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KNIT_HOSTGUARD_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("child: %q", sc.Text())
	}
	pid := cmd.Process.Pid
	lim := func(res int) unix.Rlimit {
		var l unix.Rlimit
		if err := unix.Prlimit(pid, res, nil, &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	lower := func(res int, l unix.Rlimit) {
		if err := unix.Prlimit(pid, res, &l, nil); err != nil {
			t.Fatal(err)
		}
	}
	nofile, as, cpu := lim(unix.RLIMIT_NOFILE), lim(unix.RLIMIT_AS), lim(unix.RLIMIT_CPU)
	if nofile.Cur < 16 {
		t.Skipf("RLIMIT_NOFILE %d/%d leaves no room to lower", nofile.Cur, nofile.Max)
	}
	lower(unix.RLIMIT_AS, unix.Rlimit{Cur: 1 << 40, Max: as.Max}) // the soft limit only
	// Hard limits: NOFILE's to its soft limit less one (so the soft one goes too), CPU's to
	// a day (it was unlimited, or more).
	lower(unix.RLIMIT_NOFILE, unix.Rlimit{Cur: nofile.Cur - 1, Max: nofile.Cur - 1})
	if cpu.Max > 86400 {
		lower(unix.RLIMIT_CPU, unix.Rlimit{Cur: min(cpu.Cur, 86400), Max: 86400})
	}
	io.WriteString(in, "go\n")
	if !sc.Scan() {
		t.Fatalf("child said nothing: %v", sc.Err())
	}
	var r struct {
		First, Second []Change
		Errs          []string
	}
	if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
		t.Fatalf("child said %q: %v", sc.Text(), err)
	}
	privileged := capSysResource(t)
	found := map[string]Change{}
	for i, c := range r.First {
		found[c.Resource] = c
		if privileged && r.Errs[i] != "" {
			t.Errorf("%s: %s, with CAP_SYS_RESOURCE", c.Resource, r.Errs[i])
		}
		if !privileged && c.Now.Soft != min(c.Want.Soft, c.Found.Hard) {
			t.Errorf("%s: soft limit %d, want %d", c.Resource, c.Now.Soft, min(c.Want.Soft, c.Found.Hard))
		}
	}
	want := []string{"RLIMIT_AS", "RLIMIT_NOFILE"}
	if cpu.Max > 86400 {
		want = append(want, "RLIMIT_CPU")
	}
	if len(r.First) != len(want) {
		t.Errorf("Restore found %+v, want %v", r.First, want)
	}
	for _, name := range want {
		c, ok := found[name]
		if !ok {
			t.Errorf("Restore did not find %s lowered: %+v", name, r.First)
			continue
		}
		if privileged && c.Now != c.Want {
			t.Errorf("%s: now %v, want %v", name, c.Now, c.Want)
		}
	}
	if c := found["RLIMIT_AS"]; c.Now != c.Want {
		t.Errorf("RLIMIT_AS's soft limit was not raised back: %+v", c)
	}
	if privileged && len(r.Second) != 0 {
		t.Errorf("a second Restore found %+v", r.Second)
	}
	if !privileged && strings.Join(r.Errs, "") == "" {
		t.Errorf("without CAP_SYS_RESOURCE Restore raised hard limits back: %+v", r.First)
	}
}

// capSysResource reports whether this process (and so its child) holds CAP_SYS_RESOURCE.
func capSysResource(t *testing.T) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	return data[0].Effective&(1<<unix.CAP_SYS_RESOURCE) != 0
}
