//go:build linux

package shm

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRendezvousHandsSealedMemfd(t *testing.T) {
	m, err := CreateMemfd("knit-rv", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	U32(m.Bytes(), 0).Store(0xfeed)
	r, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	name := r.Name()
	if want := fmt.Sprintf("knit-%d-", os.Getpid()); !strings.HasPrefix(name, want) || len(name) != len(want)+16 {
		t.Fatalf("Name = %q", name)
	}
	fi, err := os.Lstat(Dir + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: mode %v, want a 0600 socket", name, fi.Mode())
	}
	var peer Peer
	handed := make(chan error, 1)
	go func() {
		handed <- r.Hand(time.Now().Add(time.Minute), func(p Peer) error { peer = p; return nil }, m.File(), m.File())
	}()
	files, err := Collect(name, r.Key(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-handed; err != nil {
		t.Fatal(err)
	}
	if peer.PID != os.Getpid() || peer.UID != os.Geteuid() {
		t.Errorf("peer %+v, want pid %d uid %d", peer, os.Getpid(), os.Geteuid())
	}
	if _, err := os.Lstat(Dir + "/" + name); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the name outlived the hand-over: %v", err)
	}
	files[1].Close()
	got, err := MapFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if v := U32(got.Bytes(), 0).Load(); v != 0xfeed {
		t.Fatalf("collected mapping reads %#x", v)
	}
	if err := unix.Ftruncate(int(got.File().Fd()), 0); err != unix.EPERM {
		t.Fatalf("ftruncate of the collected region: %v, want EPERM", err)
	}
}

// A peer allow refuses gets nothing, even with the key, and the rendezvous waits on, its
// name in place, until Close.
func TestRendezvousRefusesPeer(t *testing.T) {
	m, err := CreateMemfd("knit-rv", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	refusals := make(chan error, 4)
	r.Refused = func(_ Peer, err error) { refusals <- err }
	handed := make(chan error, 1)
	go func() {
		handed <- r.Hand(time.Now().Add(time.Minute), func(Peer) error { return errors.New("not the lane") }, m.File())
	}()
	if files, err := Collect(r.Name(), r.Key(), 1); err == nil {
		files[0].Close()
		t.Fatal("a refused peer collected the file")
	}
	if err := <-refusals; err == nil || !strings.Contains(err.Error(), "not the lane") {
		t.Fatalf("Refused heard %v", err)
	}
	if _, err := os.Lstat(Dir + "/" + r.Name()); err != nil {
		t.Fatalf("the name went with a refused peer: %v", err)
	}
	r.Close()
	if err := <-handed; err == nil || !strings.Contains(err.Error(), "1 refused") {
		t.Fatalf("Hand: %v", err)
	}
}

// Peers without the key — a wrong one, none at all, too long a message — are refused and
// told to Refused; the peer with it gets the files; then the name is gone.
func TestRendezvousNeedsTheKey(t *testing.T) {
	m, err := CreateMemfd("knit-rv", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	U32(m.Bytes(), 0).Store(0xbeef)
	r, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Key()) != 64 {
		t.Fatalf("Key() = %q", r.Key())
	}
	refusals := make(chan error, 8)
	r.Refused = func(_ Peer, err error) { refusals <- err }
	handed := make(chan error, 1)
	go func() { handed <- r.Hand(time.Now().Add(time.Minute), func(Peer) error { return nil }, m.File()) }()

	wrong := strings.Repeat("0", 64)
	if files, err := Collect(r.Name(), wrong, 1); err == nil {
		files[0].Close()
		t.Fatal("a peer with the wrong key collected the file")
	}
	if err := <-refusals; err == nil || !strings.Contains(err.Error(), "wrong key") {
		t.Fatalf("wrong key: Refused heard %v", err)
	}
	raw, err := hex.DecodeString(r.Key())
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range [][]byte{nil, append(raw, 0)} { // nothing; the key and more
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: Dir + "/" + r.Name(), Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		if msg != nil {
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
		} else {
			c.CloseWrite()
		}
		if err := <-refusals; err == nil {
			t.Fatalf("message %q: refused without a reason", msg)
		}
		c.Close()
	}
	files, err := Collect(r.Name(), r.Key(), 1)
	if err != nil {
		t.Fatalf("the peer with the key: %v", err)
	}
	if err := <-handed; err != nil {
		t.Fatal(err)
	}
	got, err := MapFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if v := U32(got.Bytes(), 0).Load(); v != 0xbeef {
		t.Fatalf("collected mapping reads %#x", v)
	}
	if _, err := os.Lstat(Dir + "/" + r.Name()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the name outlived the hand-over: %v", err)
	}
	if _, err := Dial(r.Name(), "not hex"); err == nil || !strings.Contains(err.Error(), "invalid key") {
		t.Fatalf("Dial with a malformed key: %v", err)
	}
}

// TestHelperRendezvousHost is not a test: TestRendezvousRefusesPidZero runs it in a pid
// namespace of its own, where it makes a rendezvous that admits any peer allow sees, prints
// its name and key, and prints what became of the first connection.
func TestHelperRendezvousHost(t *testing.T) {
	if os.Getenv("KNIT_SHM_RV_HOST") == "" {
		t.Skip("helper process only")
	}
	m, err := CreateMemfd("knit-rv", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	r.Refused = func(p Peer, err error) {
		fmt.Printf("refused pid %d: %v\n", p.PID, err)
		r.Close()
	}
	fmt.Printf("rendezvous %s %s\n", r.Name(), r.Key())
	err = r.Hand(time.Now().Add(time.Minute), func(Peer) error { return nil }, m.File())
	fmt.Printf("hand: %v\n", err)
}

// TestRendezvousRefusesPidZero: a host in a pid namespace of its own (as in a container
// sharing /dev/shm) sees a peer outside it — this test — with pid 0. That peer is refused
// even with the right key and an allow function that admits everyone.
func TestRendezvousRefusesPidZero(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err == nil {
		err = exec.Command(unshare, "--pid", "--fork", "true").Run()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("unshare --pid cannot run here: %v", err)
		}
		t.Skipf("unshare --pid cannot run here (needs util-linux and root or user namespaces): %v", err)
	}
	cmd := exec.Command(unshare, "--pid", "--fork", "--kill-child", os.Args[0], "-test.run=^TestHelperRendezvousHost$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KNIT_SHM_RV_HOST=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	var name, key string
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "rendezvous %s %s", &name, &key); err == nil {
			break
		}
	}
	if name == "" {
		t.Fatalf("the helper made no rendezvous (%v)", sc.Err())
	}
	if files, err := Collect(name, key, 1); err == nil {
		files[0].Close()
		t.Fatal("a peer outside the host's pid namespace collected the file")
	}
	var said []string
	for sc.Scan() {
		said = append(said, sc.Text())
	}
	text := strings.Join(said, "\n")
	if !strings.Contains(text, "refused pid 0: the peer's pid is not visible here") {
		t.Fatalf("the helper said:\n%s", text)
	}
}

func TestRendezvousCloseEndsHand(t *testing.T) {
	m, err := CreateMemfd("knit-rv", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	handed := make(chan error, 1)
	go func() { handed <- r.Hand(time.Time{}, func(Peer) error { return nil }, m.File()) }()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-handed; err == nil {
		t.Fatal("Hand succeeded after Close")
	}
	if _, err := os.Lstat(Dir + "/" + r.Name()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Close left the name: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestRendezvousDeadline(t *testing.T) {
	m, err := CreateMemfd("knit-rv", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Hand(time.Now(), func(Peer) error { return nil }, m.File()); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Hand past its deadline: %v", err)
	}
}

func TestCollectRejectsBadNames(t *testing.T) {
	for _, name := range []string{"", "knit-", "foo", "knit", "../knit-x", "knit-../x", "knit-a/b", "knit-..", "/knit-x", "knit-a\x00b"} {
		if _, err := Collect(name, strings.Repeat("0", 64), 2); err == nil || !strings.Contains(err.Error(), "invalid rendezvous name") {
			t.Errorf("Collect(%q): %v", name, err)
		}
	}
	if _, err := Collect("knit-doesnotexist0000", strings.Repeat("0", 64), 2); !errors.Is(err, unix.ENOENT) {
		t.Errorf("Collect(missing): %v, want ENOENT", err)
	}
}

// deadPID returns the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run true: %v", err)
	}
	return cmd.Process.Pid
}

func TestSweep(t *testing.T) {
	dead := deadPID(t)
	leftovers := []string{
		fmt.Sprintf("knit-%d-0123456789abcdef", dead), // a rendezvous or an old region file
		fmt.Sprintf("knit-%d-fedcba9876543210", dead),
	}
	kept := []string{
		fmt.Sprintf("knit-%d-0123456789abcdef", os.Getppid()), // a living host's
		fmt.Sprintf("knit-%d-0123456789abcdef", os.Getpid()),  // this one's
		"knit-notapid-x", "knit-12x-y",
	}
	for _, n := range append(append([]string(nil), leftovers...), kept...) {
		if err := os.WriteFile(Dir+"/"+n, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(Dir + "/" + n) })
	}
	// A living host in another pid namespace: its pid means nothing here, but its socket
	// listens.
	listening := fmt.Sprintf("knit-%d-00000000feedface", dead)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: Dir + "/" + listening, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	kept = append(kept, listening)
	removed, err := Sweep()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range leftovers {
		if _, err := os.Lstat(Dir + "/" + n); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s survived the sweep", n)
		}
		if !contains(removed, n) {
			t.Errorf("Sweep did not report %s: %v", n, removed)
		}
	}
	for _, n := range kept {
		if _, err := os.Lstat(Dir + "/" + n); err != nil {
			t.Errorf("Sweep removed %s: %v", n, err)
		}
	}
	if m, _ := filepath.Glob(Dir + "/knit-" + strconv.Itoa(dead) + "-*"); len(m) != 1 || m[0] != Dir+"/"+listening {
		t.Errorf("left: %v, want only the listening %s", m, listening)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
