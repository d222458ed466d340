//go:build linux

package futex

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// futex(2) operations, deliberately without FUTEX_PRIVATE_FLAG: waiters and wakers may live
// in different processes mapping the same memory.
const (
	futexWait = 0 // FUTEX_WAIT
	futexWake = 1 // FUTEX_WAKE
)

// Wait blocks while *addr == val, for at most timeout (timeout <= 0 means no limit).
// It returns nil when woken, when *addr != val on entry (EAGAIN), or on EINTR: spurious
// wake-ups are allowed and callers re-check. It returns ErrTimedOut on timeout and wraps
// any other errno. The calling goroutine keeps its OS thread blocked while it waits.
func Wait(addr *atomic.Uint32, val uint32, timeout time.Duration) error {
	var ts *unix.Timespec // relative, as FUTEX_WAIT takes it
	if timeout > 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait,
		uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
	switch errno {
	case 0, unix.EAGAIN, unix.EINTR:
		return nil
	case unix.ETIMEDOUT:
		return ErrTimedOut
	default:
		return fmt.Errorf("knit/futex: futex_wait: %w", errno)
	}
}

// Wake wakes up to n waiters parked on addr and returns how many were woken.
// n <= 0 wakes nobody.
func Wake(addr *atomic.Uint32, n int) (int, error) {
	if n <= 0 {
		return 0, nil
	}
	n = min(n, math.MaxInt32)
	woken, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake,
		uintptr(n), 0, 0, 0)
	if errno != 0 {
		return 0, fmt.Errorf("knit/futex: futex_wake: %w", errno)
	}
	return int(woken), nil
}

// EventFD is a Linux eventfd (EFD_CLOEXEC|EFD_NONBLOCK) wrapped in an *os.File, so Wait parks
// the goroutine in Go's netpoller rather than an OS thread. One goroutine at a time may Wait;
// Signal may be called concurrently.
type EventFD struct {
	f  *os.File
	rc syscall.RawConn
}

// NewEventFD creates an eventfd with a zero counter.
func NewEventFD() (*EventFD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("knit/futex: eventfd: %w", err)
	}
	return EventFDFromFile(os.NewFile(uintptr(fd), "eventfd")), nil
}

// EventFDFromFile wraps f, an eventfd descriptor such as one inherited from a parent through
// exec.Cmd.ExtraFiles and rebuilt with os.NewFile. It takes ownership of f. The descriptor keeps
// the EFD_NONBLOCK flag it was created with, so os.NewFile registers it with the netpoller.
func EventFDFromFile(f *os.File) *EventFD {
	e := &EventFD{f: f}
	if rc, err := f.SyscallConn(); err == nil {
		e.rc = rc
	}
	return e
}

// File returns the underlying file, for instance to pass to a child through exec.Cmd.ExtraFiles.
func (e *EventFD) File() *os.File { return e.f }

// Signal adds 1 to the counter, waking a Wait. A saturated counter (EAGAIN) is not an error:
// the waiter has a wake-up pending anyway.
func (e *EventFD) Signal() error {
	if e.rc == nil {
		return fmt.Errorf("knit/futex: eventfd write: %w", os.ErrInvalid)
	}
	var buf [8]byte
	binary.NativeEndian.PutUint64(buf[:], 1)
	var werr error
	// One write attempt only: os.File.Write would park until the counter drained.
	err := e.rc.Write(func(fd uintptr) bool {
		for {
			_, werr = unix.Write(int(fd), buf[:])
			if werr != unix.EINTR {
				return true
			}
		}
	})
	if err == nil && werr != unix.EAGAIN {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("knit/futex: eventfd write: %w", err)
	}
	return nil
}

// Wait parks until the counter is non-zero, then reads and returns it, resetting it to zero.
// timeout <= 0 means no limit; otherwise Wait returns ErrTimedOut once it expires.
func (e *EventFD) Wait(timeout time.Duration) (uint64, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	if err := e.f.SetReadDeadline(deadline); err != nil {
		return 0, fmt.Errorf("knit/futex: eventfd deadline: %w", err)
	}
	var buf [8]byte
	n, err := e.f.Read(buf[:])
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return 0, ErrTimedOut
	case err != nil:
		return 0, fmt.Errorf("knit/futex: eventfd read: %w", err)
	case n != len(buf):
		return 0, fmt.Errorf("knit/futex: eventfd read: short read of %d bytes", n)
	}
	return binary.NativeEndian.Uint64(buf[:]), nil
}

// Close closes the eventfd, making a pending Wait return an error.
func (e *EventFD) Close() error {
	if err := e.f.Close(); err != nil {
		return fmt.Errorf("knit/futex: eventfd close: %w", err)
	}
	return nil
}
