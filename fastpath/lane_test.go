package fastpath

import (
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/knitgo/knit/internal/shm"
)

// The test binary doubles as a lane process: with KNIT_FASTPATH_CHILD set it maps the
// inherited region (fd 3) and echoes requests until asked to stop.
func TestMain(m *testing.M) {
	if mode := os.Getenv("KNIT_FASTPATH_CHILD"); mode != "" {
		os.Exit(childMain(mode))
	}
	goleak.VerifyTestMain(m)
}

func childMain(mode string) int {
	if mode == "unix" || mode == "atomic" {
		return baselineChild(mode)
	}
	mp, err := shm.MapFile(os.NewFile(3, "region"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 10
	}
	defer mp.Close()
	r, err := OpenRegion(mp.Bytes())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 11
	}
	spin, _ := strconv.Atoi(os.Getenv("KNIT_FASTPATH_SPIN_US"))
	bells := laneBells{lane: FutexBell{}, done: FutexBell{}}
	if err := echoLane(r, bells, time.Duration(spin)*time.Microsecond, mode == "verify"); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 12
	}
	return 0
}

type laneBells struct{ lane, done Bell }

// echoLane is a minimal lane: it copies every request into a result, checking the payload
// against the checksum the producer put in the Fn field when verify is set.
func echoLane(r *Region, bells laneBells, spin time.Duration, verify bool) error {
	req, ret := r.Requests().Consumer(), r.Returns().Producer()
	wake, done, stop := r.LaneWake(), r.Returns().Completion(), r.Stop()
	ready := func() bool { return req.Poll() != 0 || stop.Load() != StopRunning }
	wake.SetAwake()
	for {
		if !(&Spinner{Budget: spin}).Until(ready) {
			wake.Park(bells.lane, ready, 0)
		}
		pending := req.Poll()
		if pending == 0 {
			if stop.Load() == StopRequested {
				stop.Store(StopAcknowledged)
				return nil
			}
			continue
		}
		for m := pending; m != 0; m &= m - 1 {
			i := bits.TrailingZeros32(m)
			s := req.Slot(i)
			p, err := req.Payload(i)
			if err != nil {
				return err
			}
			if verify && crc32.ChecksumIEEE(p) != s.Fn() {
				return fmt.Errorf("call %d: checksum mismatch", s.Call())
			}
			j, buf := reserve(ret, len(p))
			copy(buf, p)
			rs := ret.Slot(j)
			rs.SetFn(s.Fn())
			rs.SetCall(s.Call(), s.Gen())
			ret.Publish(j)
			done.Signal(bells.done)
		}
		req.Retire(pending)
	}
}

// reserve waits for a slot and n payload bytes on p.
func reserve(p *Producer, n int) (int, []byte) {
	for {
		if i, ok := p.Reserve(); ok {
			buf, err := p.Put(i, n)
			if err == nil {
				return i, buf
			}
			p.Release(i)
			if !errors.Is(err, ErrArenaFull) {
				panic(err)
			}
		}
		runtime.Gosched()
	}
}

// host drives one lane from the test: send publishes requests, receive drains results.
type host struct {
	r     *Region
	req   *Producer
	ret   *Consumer
	wake  *Wake
	done  Completion
	bells laneBells
}

func newHost(r *Region, bells laneBells) *host {
	return &host{r: r, req: r.Requests().Producer(), ret: r.Returns().Consumer(),
		wake: r.LaneWake(), done: r.Returns().Completion(), bells: bells}
}

func (h *host) send(call uint32, payload []byte) {
	i, buf := reserve(h.req, len(payload))
	copy(buf, payload)
	s := h.req.Slot(i)
	s.SetFn(crc32.ChecksumIEEE(payload))
	s.SetCall(call, ^call)
	h.req.Publish(i)
	h.wake.Ring(h.bells.lane)
}

// receive waits (spinning for spin, then parking on the completion doorbell) for results
// and passes each to f before retiring them.
func (h *host) receive(spin time.Duration, f func(s Slot, p []byte) error) (int, error) {
	ready := func() bool { return h.ret.Poll() != 0 }
	for !(&Spinner{Budget: spin}).Until(ready) {
		h.done.Arm()
		if ready() {
			h.done.Disarm()
			break
		}
		h.done.Wait(h.bells.done, 0)
		h.done.Disarm()
	}
	pending := h.ret.Poll()
	for m := pending; m != 0; m &= m - 1 {
		i := bits.TrailingZeros32(m)
		p, err := h.ret.Payload(i)
		if err != nil {
			return 0, err
		}
		if err := f(h.ret.Slot(i), p); err != nil {
			return 0, err
		}
	}
	h.ret.Retire(pending)
	return bits.OnesCount32(pending), nil
}

func (h *host) stop() {
	h.r.Stop().Store(StopRequested)
	h.wake.Force(h.bells.lane)
}

// laneUnderTest is a lane in a goroutine or in a child process.
type laneUnderTest struct {
	*host
	ended chan struct{} // closed when the lane's goroutine or process has ended
	err   error         // why it ended, valid after ended is closed
	mp    *shm.Mapping
}

func newLaneUnderTest(h *host, run func() error) *laneUnderTest {
	l := &laneUnderTest{host: h, ended: make(chan struct{})}
	go func() {
		l.err = run()
		close(l.ended)
	}()
	return l
}

func (l *laneUnderTest) close(t testing.TB) {
	l.stop()
	<-l.ended
	if l.err != nil {
		t.Errorf("lane: %v", l.err)
	}
	if got := l.r.Stop().Load(); got != StopAcknowledged {
		t.Errorf("stop word %d after exit, want acknowledged", got)
	}
	if l.mp != nil {
		l.mp.Close()
	}
}

func goroutineLane(t testing.TB, layout Layout, spin time.Duration) *laneUnderTest {
	mem := shm.Heap(layout.Size())
	r, err := NewRegion(mem, layout, 0, 0, time.Now().UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	bells := laneBells{lane: NewChanBell(), done: NewChanBell()}
	return newLaneUnderTest(newHost(r, bells), func() error { return echoLane(r, bells, spin, true) })
}

func processLane(t testing.TB, layout Layout, spin time.Duration) *laneUnderTest {
	mp, err := shm.CreateMemfd("knit-test", layout.Size())
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRegion(mp.Bytes(), layout, 0, 0, time.Now().UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KNIT_FASTPATH_CHILD=verify",
		"KNIT_FASTPATH_SPIN_US="+strconv.Itoa(int(spin/time.Microsecond)))
	cmd.ExtraFiles = []*os.File{mp.File()}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		mp.Close()
		t.Fatal(err)
	}
	bells := laneBells{lane: FutexBell{}, done: FutexBell{}}
	l := newLaneUnderTest(newHost(r, bells), cmd.Wait)
	l.mp = mp
	return l
}

// watchdog fails the test if done is not closed in time or the lane ends first; it guards
// against hangs and makes no claim about speed.
func (l *laneUnderTest) watchdog(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-l.ended:
		t.Fatalf("%s: lane ended early: %v", what, l.err)
	case <-time.After(5 * time.Minute):
		t.Fatalf("%s stalled: watchdog fired (lane awake flag %d, wake counter %d, arm %d, pending requests %#x, results %#x)",
			what, l.r.sig(sigAwake).Load(), l.wake.counter.Load(), l.done.arm.Load(),
			l.r.Requests().Consumer().Poll(), l.ret.Poll())
	}
}
