package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/futex"
	"github.com/knitgo/knit/internal/logging"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/steal"
	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Environment of a lane process.
const (
	EnvBoot = "KNIT_BOOT" // the boot record, JSON
	EnvLane = "KNIT_LANE" // set in every lane process: NewPool refuses to run there
	// EnvSpare marks a spare: a lane process started ahead of need, with no boot record yet.
	// It waits on FDRegion, a unix socket, for its record and descriptors (see Launcher.Assign).
	// Its value is "1" when the socket is inherited, or "<rendezvous>:<key>": where the spare
	// connects for it (shm.Dial), and the secret it proves itself with.
	EnvSpare = "KNIT_SPARE"
)

// Inherited descriptors of a lane process (exec.Cmd.ExtraFiles start at 3).
const (
	FDRegion = 3 // the region's memfd (SharedMemory Inherit)
	FDDone   = 4 // the completion doorbell's eventfd
	FDSteal  = 5 // a stealing pool's shared submit ring (Boot.Steal)
)

// BootTask names one task the host serves, at the host's registry index.
type BootTask struct {
	Name        string `json:"name"`
	Index       uint32 `json:"index"`
	Fingerprint uint64 `json:"fp"`
}

// Boot is the record a host passes to a lane process in EnvBoot.
type Boot struct {
	Version     uint32     `json:"version"`
	Lane        uint32     `json:"lane"`
	Incarnation uint32     `json:"incarnation"`
	Shm         string     `json:"shm,omitempty"`     // a rendezvous (shm.Collect); empty: inherited fds
	ShmKey      string     `json:"shm_key,omitempty"` // the rendezvous's secret, which proves the lane is the lane
	Tasks       []BootTask `json:"tasks"`
	MaxCall     int        `json:"max_call"`
	Spin        int64      `json:"spin_ns"`
	Park        int64      `json:"park_ns"`
	Epoch       int64      `json:"epoch"`
	Debug       string     `json:"debug,omitempty"`
	PanicCrash  bool       `json:"panic_crash,omitempty"`
	Beat        int64      `json:"beat_ns,omitempty"` // heartbeat period (0: none)
	Carry       bool       `json:"carry,omitempty"`   // inputs open with carried context fields
	Timed       bool       `json:"timed,omitempty"`   // time each call for the host's metrics
	Sandbox     *Sandbox   `json:"sandbox,omitempty"` // applied before the lane serves
	// Limits are what the lane applies to itself before it serves (nil: nothing, as from a
	// host older than limits).
	Limits *BootLimits `json:"limits,omitempty"`
	// Steal: the pool's shared submit ring is on FDSteal (or the rendezvous's third
	// descriptor); the lane claims there as consumer Lane.
	Steal    bool `json:"steal,omitempty"`
	Consumer int  `json:"consumer,omitempty"` // the lane's consumer id on the shared ring
}

// SharedAbortBase offsets, in slot headers, the abort bits of calls from a stealing pool's
// shared ring: bit SharedAbortBase+i is bit i of the bitmap after the ring.
const SharedAbortBase = 1 << 16

// Exit statuses of a lane process.
const (
	ExitStopped  = 0  // acknowledged a stop request
	ExitBoot     = 78 // could not boot; the reason is in the region's fatal area or on stderr
	ExitProtocol = 79 // the host broke the protocol
)

// IsLane reports whether this process was started as a knit lane.
func IsLane() bool { return os.Getenv(EnvLane) != "" }

// Serve runs a lane process from its boot record and returns its exit status: it maps the
// region, checks magic, version, layout and every task fingerprint, marks itself ready and
// serves until the host asks it to stop.
//
// It logs JSON lines (logging.LaneLogger) to stderr in the lifecycle namespace, which the
// host re-emits on its own timeline: "lane booting", "lane ready" and "stop acknowledged" at
// Debug (KNIT_DEBUG=lifecycle), and every failure at Error. A failure is also written as the
// plain line "knit lane N: reason" it always was (and a crashing panic as the runtime's
// "panic: ..." text), so that the stderr tail of a startup failure or crash report reads the
// same whether or not the host parses the JSON lines.
func Serve(h Hooks) int {
	if os.Getenv(EnvSpare) != "" {
		switch err := awaitAssignment(); {
		case errors.Is(err, errNotNeeded):
			return ExitStopped
		case err != nil:
			fmt.Fprintf(os.Stderr, "knit lane: spare: %v\n", err)
			return ExitBoot
		}
	}
	b, bootErr := ParseBoot([]byte(os.Getenv(EnvBoot)))
	root := logging.LaneLogger(os.Stderr, int(b.Lane), int(b.Incarnation), os.Getpid(),
		time.Unix(0, b.Epoch), logging.ParseDebug(b.Debug))
	log := root.Named(logging.Lifecycle)
	if bootErr != nil {
		log.Error("bad boot record", zap.Error(bootErr))
		fmt.Fprintf(os.Stderr, "knit lane: bad boot record: %v\n", bootErr)
		return ExitBoot
	}
	log.Debug("lane booting", zap.Uint32("version", b.Version), zap.Int("tasks", len(b.Tasks)),
		zap.Bool("named_shm", b.Shm != ""))
	bootFailed := func(err error) int {
		log.Error("lane boot failed", zap.Error(err))
		fmt.Fprintf(os.Stderr, "knit lane %d: %v\n", b.Lane, err)
		return ExitBoot
	}
	if err := applyLimits(b.Limits, b.Lane, log); err != nil {
		return bootFailed(fmt.Errorf("applying its resource limits: %w", err))
	}
	mp, err := mapRegion(b)
	if err != nil {
		return bootFailed(err)
	}
	// The mapping stays until the process exits: the host unmaps its side only then. Its
	// file stays reachable too, or the *os.File's finalizer would close the region's
	// descriptor under the lane at some garbage collection.
	defer runtime.KeepAlive(mp)
	region, err := fastpath.OpenRegion(mp.Bytes())
	if err != nil {
		return bootFailed(err)
	}
	fail := func(format string, args ...any) int {
		msg := fmt.Sprintf(format, args...)
		region.SetFatal(msg)
		log.Error("lane boot failed", zap.String("error", msg))
		fmt.Fprintf(os.Stderr, "knit lane %d: %s\n", b.Lane, msg)
		return ExitBoot
	}
	if b.Version != fastpath.Version {
		return fail("boot record version %d, lane speaks %d", b.Version, fastpath.Version)
	}
	if region.Lane() != b.Lane || region.Incarnation() != b.Incarnation {
		return fail("region is for lane %d incarnation %d, boot record says %d/%d",
			region.Lane(), region.Incarnation(), b.Lane, b.Incarnation)
	}
	if ce := logging.Debug(root.Named(logging.Fastpath), "region mapped"); ce != nil {
		layout := region.Layout()
		ce.Write(zap.Int("bytes", len(mp.Bytes())), zap.Int("inline", layout.Inline), zap.Int("arena", layout.Arena),
			zap.Int("abort_bits", layout.AbortBits))
	}
	tasks, err := resolveTasks(b.Tasks)
	if err != nil {
		return fail("%v", err)
	}
	if ce := logging.Debug(root.Named(logging.Codec), "tasks resolved"); ce != nil {
		var names []string
		for _, t := range tasks {
			if t != nil {
				in, out := t.Codecs()
				names = append(names, fmt.Sprintf("%s(%s→%s)", t.Name(), in, out))
			}
		}
		ce.Write(zap.Strings("tasks", names))
	}
	// The sandbox goes on once the region is mapped (Named collects it over a socket) and
	// before the lane serves, so that no call runs unconfined.
	if err := applySandbox(b.Sandbox, log); err != nil {
		return fail("%v", err)
	}
	done := futex.EventFDFromFile(os.NewFile(FDDone, "knit-done"))
	var cons *steal.Consumer
	var sharedAborts fastpath.Bitmap
	if b.Steal {
		smp, err := shm.MapFile(os.NewFile(FDSteal, "knit-steal"))
		if err != nil {
			return fail("shared submit ring: %v", err)
		}
		defer runtime.KeepAlive(smp)
		ring, err := steal.Open(smp.Bytes())
		if err == nil {
			sharedAborts, err = ring.Aborts(smp.Bytes(), fastpath.DefaultAbortBits)
		}
		if err == nil {
			cons, err = ring.Consumer(b.Consumer, root)
		}
		if err != nil {
			return fail("shared submit ring: %v", err)
		}
	}
	aborts := newAbortWatch(region)
	aborts.shared = sharedAborts
	aborts.prop = h.Propagator
	exec := &actors.Executor{
		Region:  region,
		Lane:    fastpath.FutexBell{},
		Done:    fastpath.EventBell{FD: done},
		Spin:    durationNS(b.Spin),
		Park:    durationNS(b.Park),
		Tasks:   tasks,
		MaxCall: b.MaxCall,
		Context: aborts.context,
		Carried: b.Carry,
		Panic:   b.PanicCrash,
		Steal:   cons,
		// Two clock reads per call against a round trip of tens of µs: the host's metrics
		// split run from wait time with them.
		Timed: b.Timed,
	}
	region.Boot().Store(fastpath.BootReady)
	_ = done.Signal() // the host's reaper waits on this doorbell for readiness too
	log.Debug("lane ready", zap.Duration("spin", exec.Spin), zap.Duration("park", exec.Park))
	stopBeat := heartbeat(region, durationNS(b.Beat))
	err = exec.Run()
	stopBeat()
	aborts.stop()
	var pe *actors.PanicError
	if errors.As(err, &pe) { // PanicCrashesLane: die the way an unrecovered panic does
		log.Error("task panicked: the lane crashes (PanicCrashesLane)")
		fmt.Fprintf(os.Stderr, "panic: %v\n\n%s\n", pe.Value, pe.Stack)
		return 2
	}
	if err != nil {
		log.Error("lane leaving: protocol error", zap.Error(err))
		fmt.Fprintf(os.Stderr, "knit lane %d: %v\n", b.Lane, err)
		return ExitProtocol
	}
	// Run returns nil only after it stored StopAcknowledged.
	log.Debug("stop acknowledged")
	return ExitStopped
}

// mapRegion maps the region the host made for this lane. With a rendezvous name in the boot
// record (SharedMemory Named: a wrapper may have closed inherited descriptors) the lane first
// collects the region's memfd and the completion eventfd from the host's socket and puts
// them on FDRegion and FDDone, where an inheriting lane finds them.
func mapRegion(b Boot) (*shm.Mapping, error) {
	if b.Shm != "" {
		fds := []int{FDRegion, FDDone}
		if b.Steal {
			fds = append(fds, FDSteal)
		}
		files, err := shm.Collect(b.Shm, b.ShmKey, len(fds))
		if err != nil {
			return nil, err
		}
		for i, fd := range fds {
			err := unix.Dup3(int(files[i].Fd()), fd, 0)
			files[i].Close()
			if err != nil {
				return nil, fmt.Errorf("knit lane: placing descriptor %d: %w", fd, err)
			}
		}
	}
	return shm.MapFile(os.NewFile(FDRegion, "knit-region"))
}

// resolveTasks maps the host's registry indices to this binary's tasks, checking that each
// exists here with the same fingerprint.
func resolveTasks(want []BootTask) ([]actors.Def, error) {
	var tasks []actors.Def
	for _, bt := range want {
		d, ok := actors.Lookup(bt.Name)
		if !ok {
			return nil, fmt.Errorf("unknown task %q: this lane binary does not define it", bt.Name)
		}
		if d.Fingerprint() != bt.Fingerprint {
			return nil, fmt.Errorf("task %q fingerprint mismatch: host %#x, lane %#x (different In/Out types)",
				bt.Name, bt.Fingerprint, d.Fingerprint())
		}
		if bt.Index > 1<<16 {
			return nil, fmt.Errorf("task %q index %d out of range", bt.Name, bt.Index)
		}
		for int(bt.Index) >= len(tasks) {
			tasks = append(tasks, nil)
		}
		tasks[bt.Index] = d
	}
	return tasks, nil
}

func durationNS(ns int64) time.Duration { return time.Duration(ns) }

// heartbeat bumps the region's heartbeat counter every period, from a goroutine of its own:
// it beats whatever the tasks do, and stands still only when the whole process does
// (SIGSTOP, a stuck runtime). It returns a function that stops it.
func heartbeat(r *fastpath.Region, period time.Duration) (stop func()) {
	if period <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			r.Heartbeat().Add(1)
			select {
			case <-t.C:
			case <-done:
				return
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// abortWatch cancels a running call's context when the host raises its abort bit. It parks
// on the region's abort doorbell, so it costs nothing until a call is cancelled.
type abortWatch struct {
	region  *fastpath.Region
	mu      sync.Mutex
	bit     int
	cancel  func()
	stopped bool
	prop    propagation.TextMapPropagator // puts carried fields into a call's context
	shared  fastpath.Bitmap               // the abort bits of a stealing pool's shared calls
	done    chan struct{}
}

func newAbortWatch(r *fastpath.Region) *abortWatch {
	w := &abortWatch{region: r, bit: -1, done: make(chan struct{})}
	go w.run()
	return w
}

// Causes of a process lane's call context ending, for context.Cause in a task.
var (
	// ErrCallerDeadline: the caller's deadline (its context's, or the task's Timeout) passed.
	ErrCallerDeadline = &Error{Code: CodeTimeout, Lane: -1, Message: "the caller's deadline passed",
		Cause: context.DeadlineExceeded}
	// ErrCallerCanceled: the caller gave up on the call (its context was cancelled).
	ErrCallerCanceled = &Error{Code: CodeCanceled, Lane: -1, Message: "the caller cancelled the call",
		Cause: context.Canceled}
)

// context returns the context for a call with abort bit bit (or none when bit is not a
// valid bit), the caller's deadline in Unix nanoseconds (0: none) and the carried context
// fields, and a function to call when the call ends. The context's cause says which of the two ended it.
func (w *abortWatch) context(bit int, deadline int64, carried []byte) (context.Context, func()) {
	ctx, stop := context.Background(), func() {}
	if len(carried) > 0 && w.prop != nil {
		c := propagation.MapCarrier{}
		if actors.EachCarried(carried, c.Set) == nil {
			ctx = w.prop.Extract(ctx, c)
		}
	}
	if deadline != 0 {
		ctx, stop = context.WithDeadlineCause(ctx, time.Unix(0, deadline), ErrCallerDeadline)
	}
	bits, i := w.bitmap(bit)
	if i < 0 || i >= bits.Len() {
		return ctx, stop
	}
	ctx, cancel := context.WithCancelCause(ctx)
	abort := func() { cancel(ErrCallerCanceled) }
	w.mu.Lock()
	w.bit, w.cancel = bit, abort
	w.mu.Unlock()
	if bits.Test(i) { // aborted before it started
		abort()
	}
	return ctx, func() {
		w.mu.Lock()
		w.bit, w.cancel = -1, nil
		w.mu.Unlock()
		cancel(nil)
		stop()
	}
}

// bitmap is where abort bit bit lives: the lane's region, or past SharedAbortBase the
// shared ring's bitmap (a stealing pool's calls).
func (w *abortWatch) bitmap(bit int) (fastpath.Bitmap, int) {
	if bit >= SharedAbortBase {
		return w.shared, bit - SharedAbortBase
	}
	return w.region.Aborts(), bit
}

func (w *abortWatch) run() {
	defer close(w.done)
	word := w.region.AbortWake()
	for {
		seen := word.Load()
		w.mu.Lock()
		if w.stopped {
			w.mu.Unlock()
			return
		}
		if bits, i := w.bitmap(w.bit); w.cancel != nil && bits.Test(i) {
			w.cancel()
		}
		w.mu.Unlock()
		_ = futex.Wait(word, seen, 0)
	}
}

func (w *abortWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.region.AbortWake().Add(1)
	_, _ = futex.Wake(w.region.AbortWake(), 1)
	<-w.done
}

// errNotNeeded is a spare's host closing its socket: the spare was never needed.
var errNotNeeded = errors.New("not needed")

// awaitAssignment makes a spare a lane: it waits for its assignment (Launcher.Assign) and
// puts the record and descriptors where a lane started directly finds them (EnvBoot,
// FDRegion, FDDone).
func awaitAssignment() error {
	if v := os.Getenv(EnvSpare); v != "1" { // SharedMemory Named: connect for the socket
		name, key, _ := strings.Cut(v, ":")
		conn, err := shm.Dial(name, key)
		if err != nil {
			return fmt.Errorf("connecting to the host: %w", err)
		}
		err = unix.Dup3(int(conn.Fd()), FDRegion, 0)
		conn.Close()
		if err != nil {
			return err
		}
	}
	// Tell the host this process is initialised: from now on taking it costs one message.
	if _, err := unix.Write(FDRegion, []byte{1}); err != nil {
		return fmt.Errorf("reporting ready: %w", err)
	}
	buf := make([]byte, 1<<20)
	oob := make([]byte, unix.CmsgSpace(3*4))
	var n, oobn int
	var err error
	for {
		n, oobn, _, _, err = unix.Recvmsg(FDRegion, buf, oob, 0)
		if err != unix.EINTR {
			break
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("reading the assignment: %w", err)
	case n == 0 && oobn == 0:
		return errNotNeeded
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return fmt.Errorf("assignment without descriptors (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 2 && len(fds) != 3 {
		return fmt.Errorf("assignment with %d descriptors (%v)", len(fds), err)
	}
	// The region replaces the socket on FDRegion; the eventfd goes on FDDone, a shared
	// ring on FDSteal.
	for i, to := range []int{FDRegion, FDDone, FDSteal}[:len(fds)] {
		if err := unix.Dup3(fds[i], to, 0); err != nil {
			return err
		}
		unix.Close(fds[i])
	}
	_ = os.Unsetenv(EnvSpare)
	return os.Setenv(EnvBoot, string(buf[:n]))
}
