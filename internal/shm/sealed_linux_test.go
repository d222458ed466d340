//go:build linux

package shm

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSealedFileRoundTrip: what SealedFile holds, ReadSealed reads back whole, from another
// descriptor of the file too (what a child inherits), and nothing can change it.
func TestSealedFileRoundTrip(t *testing.T) {
	for _, size := range []int{0, 1, 64<<10 + 3, 4 << 20} {
		data := bytes.Repeat([]byte("knit"), size/4+1)[:size]
		f, err := SealedFile("knit-test", data)
		if err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Dup(int(f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		other := os.NewFile(uintptr(fd), "dup")
		got, err := ReadSealed(other, int64(size))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("size %d: read %d bytes (equal %v), %v", size, len(got), bytes.Equal(got, data), err)
		}
		if _, err := other.WriteAt([]byte("x"), 0); err == nil {
			t.Errorf("size %d: a write to the sealed file succeeded", size)
		}
		if err := unix.Ftruncate(fd, int64(size)+1); err != unix.EPERM {
			t.Errorf("size %d: growing it: %v, want EPERM", size, err)
		}
		other.Close()
		f.Close()
	}
}

// TestReadSealedRefuses: a file over the bound, one that could still change, and one that is
// no regular file are refused before anything is read into memory.
func TestReadSealedRefuses(t *testing.T) {
	f, err := SealedFile("knit-test", make([]byte, 100))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := ReadSealed(f, 99); err == nil || !strings.Contains(err.Error(), "100 bytes, at most 99") {
		t.Errorf("over the bound: %v", err)
	}
	plain, err := os.CreateTemp(t.TempDir(), "boot")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.WriteString("{}"); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSealed(plain, 1<<20); err == nil || !strings.Contains(err.Error(), "not sealed") {
		t.Errorf("an unsealed file: %v", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := ReadSealed(r, 1<<20); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a pipe: %v", err)
	}
}

// TestCollectUpTo: a receiver that does not know how many descriptors come takes what is
// handed, within its bound; more than the bound fails.
func TestCollectUpTo(t *testing.T) {
	m, err := CreateMemfd("knit-rv", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, c := range []struct{ handed, max int }{{3, 4}, {4, 4}, {3, 2}} {
		r, err := Listen()
		if err != nil {
			t.Fatal(err)
		}
		files := make([]*os.File, c.handed)
		for i := range files {
			files[i] = m.File()
		}
		handed := make(chan error, 1)
		go func() { handed <- r.Hand(time.Now().Add(time.Minute), func(Peer) error { return nil }, files...) }()
		got, err := CollectUpTo(r.Name(), r.Key(), c.max)
		if herr := <-handed; herr != nil {
			t.Fatal(herr)
		}
		r.Close()
		for _, f := range got {
			f.Close()
		}
		if ok := c.handed <= c.max; ok != (err == nil) || ok && len(got) != c.handed {
			t.Errorf("%d handed, up to %d collected: %d files, %v", c.handed, c.max, len(got), err)
		}
	}
	if _, err := CollectUpTo("knit-1-x", "", 9); err == nil {
		t.Error("CollectUpTo past the most a hand-over carries")
	}
}

// TestIsSealedWith: a sealed file with the very content is recognised; other content, an
// unsealed file, another kind of file or a closed number are not, and none is closed.
func TestIsSealedWith(t *testing.T) {
	marker := []byte("knit placeholder")
	f, err := SealedFile("knit-test", marker)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	other, err := SealedFile("knit-test", []byte("knit placeholder!"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	plain, err := os.CreateTemp(t.TempDir(), "marker")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Write(marker); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if !IsSealedWith(int(f.Fd()), marker) {
		t.Error("the marker is not recognised")
	}
	for name, fd := range map[string]int{"other content": int(other.Fd()), "unsealed": int(plain.Fd()), "pipe": int(r.Fd()), "closed": 1 << 20} {
		if IsSealedWith(fd, marker) {
			t.Errorf("%s taken for the marker", name)
		}
	}
	if _, err := f.Stat(); err != nil {
		t.Errorf("the marker was closed: %v", err)
	}
}
