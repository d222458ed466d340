//go:build linux

package shm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	files, err := Collect(name, 2)
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
	handed := make(chan error, 1)
	go func() {
		handed <- r.Hand(time.Now().Add(time.Minute), func(Peer) error { return errors.New("not the lane") }, m.File())
	}()
	if files, err := Collect(r.Name(), 1); err == nil {
		files[0].Close()
		t.Fatal("a refused peer collected the file")
	}
	if err := <-handed; err == nil || !strings.Contains(err.Error(), "not the lane") {
		t.Fatalf("Hand: %v", err)
	}
	// Exactly one connection: the name is gone after the refusal.
	if _, err := Collect(r.Name(), 1); err == nil {
		t.Fatal("a second peer connected")
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
		if _, err := Collect(name, 2); err == nil || !strings.Contains(err.Error(), "invalid rendezvous name") {
			t.Errorf("Collect(%q): %v", name, err)
		}
	}
	if _, err := Collect("knit-doesnotexist0000", 2); !errors.Is(err, unix.ENOENT) {
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
	if m, _ := filepath.Glob(Dir + "/knit-" + strconv.Itoa(dead) + "-*"); len(m) > 0 {
		t.Errorf("left: %v", m)
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
