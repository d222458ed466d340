// Package fds moves descriptors a process received onto the numbers it promises them at,
// without closing one it does not own. The Go runtime opens descriptors of its own before
// main (its cgroup's CPU limit files, the netpoller's epoll and eventfd) at the lowest free
// numbers; a dup2 onto such a number closes the runtime's file under it, and an epoll
// descriptor replaced so makes the next netpoll fail fatally.
package fds

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// ID identifies an open file: its device and inode. The zero ID is no file.
type ID struct{ Dev, Ino uint64 }

// Of returns the ID of the file open on fd; false if fd is not open.
func Of(fd int) (ID, bool) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return ID{}, false
	}
	return ID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)}, true
}

// Place moves fd, which the caller owns, to target and returns the number it is now open
// at: target if target was free or held one of ours (a placeholder: a file the caller put
// there to keep the number for itself); fd itself, untouched, if target belongs to
// something else. A free target is taken with F_DUPFD, which cannot take it from under a
// file opened there meanwhile.
func Place(fd, target int, ours ...ID) (int, error) {
	if fd == target {
		return fd, nil
	}
	if held(target, ours) {
		if err := unix.Dup3(fd, target, 0); err != nil {
			return -1, fmt.Errorf("knit/fds: placing descriptor %d: %w", target, err)
		}
		unix.Close(fd)
		return target, nil
	}
	n, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD, target)
	if err != nil {
		return -1, fmt.Errorf("knit/fds: placing descriptor %d: %w", target, err)
	}
	if n != target { // taken: leave fd where it is
		unix.Close(n)
		return fd, nil
	}
	unix.Close(fd)
	return target, nil
}

// Drop closes target if it holds one of ours: a number kept for a file that did not come.
func Drop(target int, ours ...ID) {
	if held(target, ours) {
		unix.Close(target)
	}
}

// held reports whether fd holds one of ours.
func held(fd int, ours []ID) bool {
	id, ok := Of(fd)
	if !ok {
		return false
	}
	for _, o := range ours {
		if o != (ID{}) && o == id {
			return true
		}
	}
	return false
}
