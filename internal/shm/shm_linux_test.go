//go:build linux

package shm

import (
	"bytes"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMemfdSharedWithMapFile(t *testing.T) {
	m, err := CreateMemfd("knit-test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(m.Bytes()) != 4096 {
		t.Fatalf("len = %d", len(m.Bytes()))
	}
	copy(m.Bytes(), "hello, lane")

	dup, err := unix.Dup(int(m.File().Fd()))
	if err != nil {
		t.Fatal(err)
	}
	m2, err := MapFile(os.NewFile(uintptr(dup), "dup"))
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if !bytes.Equal(m2.Bytes(), m.Bytes()) || !bytes.HasPrefix(m2.Bytes(), []byte("hello, lane")) {
		t.Fatalf("second mapping sees %q", m2.Bytes()[:16])
	}
	U32(m2.Bytes(), 64).Store(42)
	if got := U32(m.Bytes(), 64).Load(); got != 42 {
		t.Fatalf("first mapping sees %d, want 42", got)
	}
}

func TestCloseIdempotent(t *testing.T) {
	m, err := CreateMemfd("knit-close", 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if m.File() != nil || m.Bytes() != nil {
		t.Fatal("File/Bytes not nil after Close")
	}
}

func TestBadSizes(t *testing.T) {
	sizes := []int{0, -1}
	if strconv.IntSize == 64 {
		big := int64(1)<<32 + 1
		sizes = append(sizes, int(big))
	}
	for _, size := range sizes {
		if m, err := CreateMemfd("knit-bad", size); err == nil {
			m.Close()
			t.Errorf("CreateMemfd(%d) succeeded", size)
		}
	}
}

func TestMapFileEmpty(t *testing.T) {
	fd, err := unix.MemfdCreate("knit-empty", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := MapFile(os.NewFile(uintptr(fd), "empty")); err == nil {
		m.Close()
		t.Fatal("MapFile of an empty file succeeded")
	}
}

// TestMemfdSealed plays a hostile lane holding the region's file: it cannot resize it, so the
// creator's mapping can never fault.
func TestMemfdSealed(t *testing.T) {
	m, err := CreateMemfd("knit-sealed", 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// Another process would hold its own descriptor of the same file: a reopen through /proc
	// is exactly that, with none of the creator's state.
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(m.File().Fd())), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int64{0, 4096, 1 << 20} {
		if err := unix.Ftruncate(int(f.Fd()), size); err != unix.EPERM {
			t.Errorf("ftruncate to %d: %v, want EPERM", size, err)
		}
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err != unix.EPERM {
		t.Errorf("adding a seal: %v, want EPERM (F_SEAL_SEAL)", err)
	}
	got, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || got != seals {
		t.Fatalf("seals %#x, %v; want %#x", got, err, seals)
	}
	m.Bytes()[8191] = 1 // still the whole size, still writable
}
