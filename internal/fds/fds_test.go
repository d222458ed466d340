package fds

import (
	"testing"

	"golang.org/x/sys/unix"
)

// open returns a fresh descriptor of a new pipe's read end, and its ID.
func open(t *testing.T) (int, ID) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	unix.Close(p[1])
	id, ok := Of(p[0])
	if !ok {
		t.Fatal("a pipe just made is not open")
	}
	return p[0], id
}

// free returns a descriptor number no file is open at, above every one this process holds.
func free(t *testing.T) int {
	t.Helper()
	fd, _ := open(t)
	n, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD, 1000)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	unix.Close(n)
	return n
}

// TestPlace: a file goes to a free number or over its placeholder, and never over a file
// that is not the placeholder, which stays open as it was.
func TestPlace(t *testing.T) {
	t.Run("free", func(t *testing.T) {
		fd, id := open(t)
		target := free(t)
		got, err := Place(fd, target)
		if err != nil || got != target {
			t.Fatalf("Place to a free number: %d, %v", got, err)
		}
		if now, ok := Of(target); !ok || now != id {
			t.Fatalf("%d holds %v, want the placed file %v", target, now, id)
		}
		if _, ok := Of(fd); ok {
			t.Error("the placed file is still open where it was")
		}
		unix.Close(target)
	})
	t.Run("placeholder", func(t *testing.T) {
		ph, phID := open(t)
		fd, id := open(t)
		target := free(t)
		if err := unix.Dup3(ph, target, 0); err != nil {
			t.Fatal(err)
		}
		unix.Close(ph)
		got, err := Place(fd, target, ID{Ino: 1}, phID)
		if now, _ := Of(target); err != nil || got != target || now != id {
			t.Fatalf("Place over the placeholder: %d, %v; %d holds %v", got, err, target, now)
		}
		unix.Close(target)
	})
	t.Run("taken", func(t *testing.T) {
		other, otherID := open(t)
		fd, id := open(t)
		got, err := Place(fd, other, ID{Ino: 1})
		if err != nil || got != fd {
			t.Fatalf("Place onto another's descriptor: %d, %v; want it left at %d", got, err, fd)
		}
		if now, _ := Of(other); now != otherID {
			t.Fatalf("the other file was replaced: %v, want %v", now, otherID)
		}
		if now, _ := Of(fd); now != id {
			t.Fatal("the file to place is gone")
		}
		unix.Close(other)
		unix.Close(fd)
	})
}

// TestDrop closes a placeholder and nothing else.
func TestDrop(t *testing.T) {
	ph, phID := open(t)
	other, _ := open(t)
	Drop(other, phID)
	Drop(ph)
	if _, ok := Of(other); !ok {
		t.Fatal("Drop closed a file that is not the placeholder")
	}
	if _, ok := Of(ph); !ok {
		t.Fatal("Drop with no placeholder closed a file")
	}
	Drop(ph, phID)
	if _, ok := Of(ph); ok {
		t.Fatal("the placeholder is still open")
	}
	unix.Close(other)
}
