//go:build linux

package privs

import (
	"encoding/json"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// childReport is what the child of TestDropAllThreads saw of itself.
type childReport struct {
	Before, After []Thread
	Dumpable      int
}

// In a child process with 16 threads of its own, NoNewPrivs, DropCapabilities and Undumpable
// reach every thread: no capability is left in any set, no_new_privs is set everywhere, the
// process is not dumpable, and a thread started afterwards inherits all of it.
func TestDropAllThreads(t *testing.T) {
	if os.Getenv("KNIT_PRIVS_CHILD") == "1" {
		dropChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDropAllThreads$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KNIT_PRIVS_CHILD=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var r childReport
	line, _, _ := strings.Cut(string(out), "\n")
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("child said %q: %v", out, err)
	}
	if len(r.After) < 17 {
		t.Fatalf("the child had %d threads, want at least 17", len(r.After))
	}
	if os.Geteuid() == 0 && r.Before[0].Effective == 0 {
		t.Errorf("a child of root started with no effective capability: %+v", r.Before[0])
	}
	ambient := false
	for _, th := range r.Before {
		ambient = ambient || th.Ambient != 0
	}
	if os.Geteuid() == 0 && !ambient {
		t.Errorf("no thread of the root child had an ambient capability before the drop: %+v", r.Before)
	}
	for _, th := range r.After {
		if th.Effective != 0 || th.Permitted != 0 || th.Inheritable != 0 || th.Ambient != 0 || !th.NoNewPrivs {
			t.Errorf("thread %d after the drop: %+v", th.TID, th)
		}
	}
	if r.Dumpable != 0 {
		t.Errorf("dumpable %d after Undumpable", r.Dumpable)
	}
}

func dropChild() {
	var ready, wg sync.WaitGroup
	release := make(chan struct{})
	for range 16 {
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			ready.Done()
			<-release
		}()
	}
	ready.Wait()
	var r childReport
	var err error
	must := func(e error) {
		if e != nil {
			panic(e)
		}
	}
	if os.Geteuid() == 0 {
		// One thread makes CAP_NET_BIND_SERVICE ambient (inheritable first), which the drop
		// must take too.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		must(unix.Capget(&hdr, &data[0]))
		data[0].Inheritable |= 1 << unix.CAP_NET_BIND_SERVICE
		must(unix.Capset(&hdr, &data[0]))
		must(unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, unix.CAP_NET_BIND_SERVICE, 0, 0))
	}
	r.Before, err = Threads()
	must(err)
	must(NoNewPrivs())
	must(DropCapabilities())
	must(Undumpable())
	// One more thread, started after the drop.
	late := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		close(late)
		<-release
	}()
	<-late
	r.After, err = Threads()
	must(err)
	r.Dumpable, err = Dumpable()
	must(err)
	close(release)
	wg.Wait()
	b, _ := json.Marshal(r)
	os.Stdout.Write(append(b, '\n')) // the first line of its output
}

func TestParseStatus(t *testing.T) {
	th, err := parseStatus([]byte("Name:\tx\nPid:\t42\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\n" +
		"CapEff:\t000001ffffffffff\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n"))
	if err != nil || th.TID != 42 || th.Effective != 0x1ffffffffff || !th.NoNewPrivs || th.Ambient != 0 {
		t.Fatalf("%+v, %v", th, err)
	}
	if _, err := parseStatus([]byte("Name:\tx\n")); err == nil {
		t.Fatal("a status without capabilities parsed")
	}
	if _, err := parseStatus([]byte("CapInh:\tzz\nCapPrm:\t0\nCapEff:\t0\nCapBnd:\t0\n")); err == nil {
		t.Fatal("a malformed set parsed")
	}
}
