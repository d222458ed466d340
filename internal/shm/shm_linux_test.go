//go:build linux

package shm

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMemfdSharedWithMapFile(t *testing.T) {
	m, err := CreateMemfd("knit-test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Name() != "" {
		t.Fatalf("memfd Name = %q, want empty", m.Name())
	}
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
	if err := m2.Unlink(); err != nil {
		t.Fatalf("Unlink on memfd: %v", err)
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

func TestNamedRemovedOnClose(t *testing.T) {
	m, err := CreateNamed(8192)
	if err != nil {
		t.Fatal(err)
	}
	name := m.Name()
	if want := fmt.Sprintf("knit-%d-", os.Getpid()); !strings.HasPrefix(name, want) || len(name) != len(want)+16 {
		t.Fatalf("Name = %q", name)
	}
	path := "/dev/shm/" + name
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != 8192 {
		t.Fatalf("%s: mode %v size %d, want 0600 and 8192", path, fi.Mode(), fi.Size())
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after Close, stat %s: %v", path, err)
	}
}

func TestNamedUnlink(t *testing.T) {
	m, err := CreateNamed(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	path := "/dev/shm/" + m.Name()
	if err := m.Unlink(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after Unlink, stat %s: %v", path, err)
	}
	if err := m.Unlink(); err != nil {
		t.Fatalf("second Unlink: %v", err)
	}
	m.Bytes()[0] = 1 // still mapped
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenNamed(t *testing.T) {
	m, err := CreateNamed(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	U64(m.Bytes(), 8).Store(7)

	o, err := OpenNamed(m.Name())
	if err != nil {
		t.Fatal(err)
	}
	if o.Name() != m.Name() || len(o.Bytes()) != 4096 {
		t.Fatalf("opened %q with %d bytes", o.Name(), len(o.Bytes()))
	}
	if got := U64(o.Bytes(), 8).Load(); got != 7 {
		t.Fatalf("opener sees %d, want 7", got)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/dev/shm/" + m.Name()); err != nil {
		t.Fatalf("opener's Close removed the entry: %v", err)
	}
}

func TestOpenNamedRejectsBadNames(t *testing.T) {
	for _, name := range []string{"", "knit-", "foo", "knit", "../knit-x", "knit-../x", "knit-a/b", "knit-..", "/knit-x", "knit-a\x00b"} {
		if m, err := OpenNamed(name); err == nil {
			m.Close()
			t.Errorf("OpenNamed(%q) succeeded", name)
		} else if !strings.Contains(err.Error(), "invalid mapping name") {
			t.Errorf("OpenNamed(%q): %v", name, err)
		}
	}
	if _, err := OpenNamed("knit-doesnotexist0000"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("OpenNamed(missing): %v, want ENOENT", err)
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
		if m, err := CreateNamed(size); err == nil {
			m.Close()
			t.Errorf("CreateNamed(%d) succeeded", size)
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
