//go:build linux

package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared-memory layout of the shm rows: one page, the request word at
// uint32 index 0 and the reply word at uint32 index 16 (byte 64, a
// different cache line, so the two writers never share a line).
const (
	shmSize      = 4096
	shmReqWord   = 0
	shmReplyWord = 16
)

// Non-private futex operations (the words are shared between processes, so
// FUTEX_PRIVATE_FLAG must not be set).
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// Spin tuning for the spinning sides. An uncontended round trip takes a few
// hundred polls, so only the Gosched ever fires inside a clean measurement;
// the OS-level yield matters only when other processes compete for the
// CPUs (then the peer may be descheduled and spinning a whole time slice
// away would be pointless), and the nap only between scenarios.
const (
	spinYieldEvery   = 256     // runtime.Gosched every this many empty polls
	spinOSYieldEvery = 1 << 14 // sched_yield(2) every this many empty polls
	spinIdlePolls    = 1 << 22 // child only: after this many empty polls in a row, nap between polls
	spinIdleNap      = 50 * time.Microsecond
)

// spinPause is called by a spinning side after each empty poll; polls is
// the number of empty polls so far.
func spinPause(polls int) {
	if polls%spinYieldEvery == 0 {
		runtime.Gosched()
	}
	if polls%spinOSYieldEvery == 0 {
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// shmWord returns a pointer to the uint32 at index i of the mapping.
func shmWord(mem []byte, i int) *uint32 {
	return (*uint32)(unsafe.Pointer(&mem[i*4]))
}

func futexWait(addr *uint32, val uint32, timeout *unix.Timespec) {
	// EAGAIN (value already changed), EINTR and ETIMEDOUT all mean "look
	// again"; the callers loop on the word itself.
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(timeout)), 0, 0)
}

func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, 1, 0, 0, 0)
}

// shmChildMain is the KNIT_BENCH_CHILD=shm-spin / shm-futex role. fd 3 is
// the memfd holding the shared page, fd 4 the read end of the lifeline
// pipe. Whenever the request word changes, copy it to the reply word. The
// spinning child polls (see spinPause; it naps only after a long idle
// stretch); the futex child sleeps in
// FUTEX_WAIT on the request word and FUTEX_WAKEs the parent after replying.
// The child exits 0 when the lifeline reaches EOF.
func shmChildMain(useFutex bool) int {
	mem, err := unix.Mmap(3, 0, shmSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shm child: mmap:", err)
		return 2
	}
	life := os.NewFile(4, "bench-lifeline")
	if life == nil {
		fmt.Fprintln(os.Stderr, "shm child: fd 4 missing")
		return 2
	}
	go func() {
		io.Copy(io.Discard, life) // returns at EOF: the parent closed its end or died
		os.Exit(0)
	}()

	req := shmWord(mem, shmReqWord)
	reply := shmWord(mem, shmReplyWord)
	last := atomic.LoadUint32(reply)
	if useFutex {
		for {
			v := atomic.LoadUint32(req)
			if v == last {
				futexWait(req, last, nil)
				continue
			}
			atomic.StoreUint32(reply, v)
			futexWake(reply)
			last = v
		}
	}
	idle := 0
	for {
		v := atomic.LoadUint32(req)
		if v != last {
			atomic.StoreUint32(reply, v)
			last = v
			idle = 0
			continue
		}
		idle++
		spinPause(idle)
		if idle >= spinIdlePolls {
			// The parent is between scenarios; do not hold a CPU.
			time.Sleep(spinIdleNap)
		}
	}
}
