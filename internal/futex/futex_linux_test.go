//go:build linux

package futex

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/knitgo/knit/internal/shm"
	"golang.org/x/sys/unix"
)

// watchdog bounds every wait in these tests: reaching it fails the test instead of hanging.
const watchdog = 60 * time.Second

// waitFor futex-waits until *w == want, a deadline passes, or *w == abort.
func waitFor(w *atomic.Uint32, want, abort uint32, deadline time.Time) error {
	for {
		v := w.Load()
		if v == want {
			return nil
		}
		if v == abort {
			return errors.New("aborted")
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("watchdog: word is %d, want %d", v, want)
		}
		if err := Wait(w, v, left); err != nil && !errors.Is(err, ErrTimedOut) {
			return err
		}
	}
}

func TestWaitValueDiffers(t *testing.T) {
	var w atomic.Uint32
	w.Store(1)
	if err := Wait(&w, 0, 0); err != nil {
		t.Fatalf("Wait with differing value: %v", err)
	}
}

func TestWaitTimesOut(t *testing.T) {
	var w atomic.Uint32
	// Wait may return nil spuriously (EINTR); only ErrTimedOut or nil are acceptable.
	for i := 0; ; i++ {
		err := Wait(&w, 0, 5*time.Millisecond)
		if errors.Is(err, ErrTimedOut) {
			return
		}
		if err != nil || i == 100 {
			t.Fatalf("Wait: %v, want ErrTimedOut", err)
		}
	}
}

func TestWakeNobody(t *testing.T) {
	var w atomic.Uint32
	if n, err := Wake(&w, 1); n != 0 || err != nil {
		t.Fatalf("Wake with no waiters = %d, %v", n, err)
	}
}

func TestWakeParkedWaiter(t *testing.T) {
	var w atomic.Uint32
	started, done := make(chan struct{}), make(chan error, 1)
	go func() {
		close(started)
		done <- waitFor(&w, 1, 1, time.Now().Add(watchdog))
	}()
	<-started

	// Ring until the kernel reports a parked waiter was woken; the waiter re-checks, still
	// sees 0 and parks again. This proves Wake reaches a goroutine blocked in Wait.
	deadline := time.Now().Add(watchdog)
	for {
		n, err := Wake(&w, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if n != 0 || time.Now().After(deadline) {
			t.Fatalf("Wake = %d, never woke the parked waiter", n)
		}
		runtime.Gosched()
	}

	w.Store(1)
	if _, err := Wake(&w, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(watchdog):
		t.Fatal("watchdog: waiter never returned")
	}
}

const (
	childEnv = "KNIT_FUTEX_CHILD"
	rounds   = 1000
	abort    = ^uint32(0) // stored in the pong word when the child exits early
)

// TestCrossProcessPingPong re-executes the test binary as a child sharing a memfd (fd 3).
// Round i: the parent stores i into word 0 and wakes it; the child, parked on word 0,
// stores 2*i into word 4 and wakes it; the parent is parked on word 4.
func TestCrossProcessPingPong(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		if err := pingPongChild(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}

	m, err := shm.CreateMemfd("knit-futex-test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ping, pong := shm.U32(m.Bytes(), 0), shm.U32(m.Bytes(), 4)

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrossProcessPingPong$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.ExtraFiles = []*os.File{m.File()}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		// If the child died mid-round, unblock the parent; a finished run keeps its last value.
		for {
			v := pong.Load()
			if v == 2*rounds || pong.CompareAndSwap(v, abort) {
				break
			}
		}
		Wake(pong, 1)
		exited <- err
	}()

	deadline := time.Now().Add(watchdog)
	for i := uint32(1); i <= rounds; i++ {
		ping.Store(i)
		if _, err := Wake(ping, 1); err != nil {
			t.Fatal(err)
		}
		if err := waitFor(pong, 2*i, abort, deadline); err != nil {
			cmd.Process.Kill()
			cerr := <-exited
			t.Fatalf("round %d: %v (child: %v)\nchild output:\n%s", i, err, cerr, out.String())
		}
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out.String())
		}
	case <-time.After(watchdog):
		cmd.Process.Kill()
		<-exited
		t.Fatal("watchdog: child did not exit")
	}
}

func pingPongChild() error {
	m, err := shm.MapFile(os.NewFile(3, "shm"))
	if err != nil {
		return err
	}
	defer m.Close()
	ping, pong := shm.U32(m.Bytes(), 0), shm.U32(m.Bytes(), 4)
	deadline := time.Now().Add(watchdog)
	for i := uint32(1); i <= rounds; i++ {
		if err := waitFor(ping, i, abort, deadline); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		pong.Store(2 * i)
		if _, err := Wake(pong, 1); err != nil {
			return err
		}
	}
	return nil
}

func TestEventFDSignalWait(t *testing.T) {
	e, err := NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for range 3 {
		if err := e.Signal(); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := e.Wait(watchdog); n != 3 || err != nil {
		t.Fatalf("Wait = %d, %v; want 3, nil", n, err)
	}
	// The read reset the counter: the next Wait parks until signalled from another goroutine.
	signalled := make(chan error, 1)
	go func() { signalled <- e.Signal() }()
	if n, err := e.Wait(watchdog); n != 1 || err != nil {
		t.Fatalf("Wait = %d, %v; want 1, nil", n, err)
	}
	if err := <-signalled; err != nil {
		t.Fatal(err)
	}
}

func TestEventFDTimeout(t *testing.T) {
	e, err := NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if n, err := e.Wait(5 * time.Millisecond); !errors.Is(err, ErrTimedOut) {
		t.Fatalf("Wait = %d, %v; want ErrTimedOut", n, err)
	}
}

func TestEventFDFromFile(t *testing.T) {
	e, err := NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// Rebuild from a second descriptor, as a child does with an inherited fd.
	rc, err := e.File().SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var dup int
	var derr error
	dupCloexec := func(fd uintptr) { dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }
	if err := rc.Control(dupCloexec); err != nil || derr != nil {
		t.Fatal(err, derr)
	}
	e2 := EventFDFromFile(os.NewFile(uintptr(dup), "eventfd-dup"))
	defer e2.Close()
	if err := e2.Signal(); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Wait(watchdog); n != 1 || err != nil {
		t.Fatalf("Wait = %d, %v; want 1, nil", n, err)
	}
	if n, err := e2.Wait(5 * time.Millisecond); !errors.Is(err, ErrTimedOut) {
		t.Fatalf("rebuilt Wait = %d, %v; want ErrTimedOut (deadlines work)", n, err)
	}
}
