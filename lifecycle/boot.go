package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/fds"
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
	// EnvBoot holds the boot record's settings, JSON: Boot without its tasks (or, should
	// those be over maxBootEnv, only its version, lane, incarnation and rendezvous), so that
	// code that runs in a lane before knit.Main, in init, can tell which lane it is. Serve
	// sets it to the whole settings once booted (a spare has none before). The record itself
	// (EncodeBoot) is on FDBoot, or at the rendezvous named in the settings' shm: the kernel
	// refuses an exec whose environment has a string over 128 KiB, which a table of 2,000
	// tasks was.
	EnvBoot = "KNIT_BOOT"
	EnvLane = "KNIT_LANE" // set in every lane process: NewPool refuses to run there
	// EnvSpare marks a spare: a lane process started ahead of need, with no boot record yet.
	// It waits on FDRegion, a unix socket, for its record and descriptors (see Launcher.Assign).
	// Its value is "1" when the socket is inherited, or "<rendezvous>:<key>": where the spare
	// connects for it (shm.Dial), and the secret it proves itself with.
	EnvSpare = "KNIT_SPARE"
)

// maxBootEnv bounds the settings EnvBoot carries: far below the kernel's 128 KiB for one
// environment string.
const maxBootEnv = 16 << 10

// Inherited descriptors of a lane process (exec.Cmd.ExtraFiles start at 3).
const (
	FDRegion = 3 // the region's memfd (SharedMemory Inherit)
	FDDone   = 4 // the completion doorbell's eventfd
	FDSteal  = 5 // a stealing pool's shared submit ring (Boot.Steal)
	// FDBoot is the boot record (a sealed memfd) of a lane that inherits its descriptors.
	// The lane closes it once read.
	FDBoot = 6
)

// BootTask names one task the host serves, at the host's registry index.
type BootTask struct {
	Name        string `json:"name"`
	Index       uint32 `json:"index"`
	Fingerprint uint64 `json:"fp"`
}

// Boot is the record a host passes to a lane process (EncodeBoot, EnvBoot).
type Boot struct {
	Version     uint32     `json:"version"`
	Lane        uint32     `json:"lane"`
	Incarnation uint32     `json:"incarnation"`
	Shm         string     `json:"shm,omitempty"`     // a rendezvous (shm.CollectUpTo) for the record and descriptors; empty: inherited
	ShmKey      string     `json:"shm_key,omitempty"` // the rendezvous's secret, which proves the lane is the lane (in EnvBoot, with Shm)
	Tasks       []BootTask `json:"-"`                 // in the record's binary task table (EncodeBoot)
	MaxCall     int        `json:"max_call"`
	Spin        int64      `json:"spin_ns"`
	SpinOne     int64      `json:"spin_one_ns,omitempty"` // when calls come one at a time (actors.Executor.SpinOne)
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
	// StealRing is the shared ring's shape (steal.OpenConfig): the lane trusts it rather than
	// the mapping's control block, which any lane can write (nil: read the control block, as
	// from a host older than it).
	StealRing *steal.Config `json:"steal_ring,omitempty"`
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
	record, at, err := receiveBoot()
	if errors.Is(err, errNotNeeded) {
		return ExitStopped
	}
	var b Boot
	recvErr, bootErr := err, error(nil)
	if err == nil {
		b, bootErr = DecodeBoot(record)
	}
	root := logging.LaneLogger(os.Stderr, int(b.Lane), int(b.Incarnation), os.Getpid(),
		time.Unix(0, b.Epoch), logging.ParseDebug(b.Debug))
	log := root.Named(logging.Lifecycle)
	switch {
	case recvErr != nil:
		log.Error("no boot record", zap.Error(recvErr))
		fmt.Fprintf(os.Stderr, "knit lane: %v\n", recvErr)
		return ExitBoot
	case bootErr != nil:
		log.Error("bad boot record", zap.Error(bootErr))
		fmt.Fprintf(os.Stderr, "knit lane: bad boot record: %v\n", bootErr)
		return ExitBoot
	}
	if settings, err := bootEnv(b, 0); err == nil {
		_ = os.Setenv(EnvBoot, settings) // the whole settings, for the lane's tasks
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
	mp, err := shm.MapFile(os.NewFile(uintptr(at.region), "knit-region"))
	if err != nil {
		return bootFailed(err)
	}
	regionFD.Store(int32(at.region))
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
	done := futex.EventFDFromFile(os.NewFile(uintptr(at.done), "knit-done"))
	var cons *steal.Consumer
	var sharedAborts fastpath.Bitmap
	if b.Steal {
		if at.steal < 0 {
			return fail("shared submit ring: the host sent none")
		}
		smp, err := shm.MapFile(os.NewFile(uintptr(at.steal), "knit-steal"))
		if err != nil {
			return fail("shared submit ring: %v", err)
		}
		defer runtime.KeepAlive(smp)
		var ring *steal.Ring
		if b.StealRing != nil {
			ring, err = steal.OpenConfig(smp.Bytes(), *b.StealRing)
		} else {
			ring, err = steal.Open(smp.Bytes())
		}
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
	if h.DeadlineCause != nil {
		aborts.deadline = h.DeadlineCause
	}
	if h.CanceledCause != nil {
		aborts.canceled = h.CanceledCause
	}
	exec := &actors.Executor{
		Region:  region,
		Lane:    fastpath.FutexBell{},
		Done:    fastpath.EventBell{FD: done},
		Spin:    durationNS(b.Spin),
		SpinOne: durationNS(b.SpinOne),
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
	// A lane of a stealing pool beats on while parked: calls wait for it on the shared ring
	// too, where the host does not look whether they do.
	var pause *beatPause
	if !b.Steal {
		pause = newBeatPause()
		exec.Woke = pause.woke
	}
	region.Boot().Store(fastpath.BootReady)
	_ = done.Signal() // the host's reaper waits on this doorbell for readiness too
	log.Debug("lane ready", zap.Duration("spin", exec.Spin), zap.Duration("park", exec.Park))
	stopBeat := heartbeat(region, durationNS(b.Beat), pause)
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

// regionFD is where the lane's region is open (RegionFD).
var regionFD atomic.Int32

func init() { regionFD.Store(-1) }

// RegionFD is the descriptor a lane process's region is open at, once Serve has mapped it
// (-1 before, and in a host): FDRegion, unless the lane received its descriptors at run time
// and the Go runtime held that number already (SharedMemory Named behind a wrapper that
// closes inherited descriptors; see placeFDs).
func RegionFD() int { return int(regionFD.Load()) }

// laneFDs are where a lane's descriptors are: FDRegion, FDDone and FDSteal, unless the
// lane received them at run time (a spare, or SharedMemory Named) and one of those numbers
// belonged to something else (see placeFDs).
type laneFDs struct{ region, done, steal int }

var inheritedFDs = laneFDs{FDRegion, FDDone, FDSteal}

// receiveBoot returns the lane's boot record, with its descriptors in place: a spare waits
// for its assignment, a lane whose settings name a rendezvous (SharedMemory Named) collects
// them there, and a lane that inherited them finds the record on FDBoot.
func receiveBoot() ([]byte, laneFDs, error) {
	if os.Getenv(EnvSpare) != "" {
		record, at, err := awaitAssignment()
		if err != nil && !errors.Is(err, errNotNeeded) {
			err = fmt.Errorf("spare: %w", err)
		}
		return record, at, err
	}
	env := os.Getenv(EnvBoot)
	if env == "" {
		return nil, laneFDs{}, fmt.Errorf("no %s: this process was not started by a knit host", EnvBoot)
	}
	var where struct {
		Shm    string `json:"shm"`
		ShmKey string `json:"shm_key"`
	}
	if err := json.Unmarshal([]byte(env), &where); err != nil {
		return nil, laneFDs{}, fmt.Errorf("%s: %w", EnvBoot, err)
	}
	if where.Shm == "" {
		record, err := readBoot(FDBoot)
		return record, inheritedFDs, err
	}
	// A wrapper may have closed inherited descriptors: the record and the others come from
	// the host's socket, which hands them over only to a peer that sends the key. The host
	// put the record's file on 3 to 5 too, to keep those numbers for them, in case the
	// wrapper lets them through.
	files, err := shm.CollectUpTo(where.Shm, where.ShmKey, 4)
	if err != nil {
		return nil, laneFDs{}, err
	}
	raw := make([]int, len(files))
	for i, f := range files {
		if raw[i], err = unix.Dup(int(f.Fd())); err != nil { // a number no *os.File will close
			raw[i] = -1
		}
		f.Close()
	}
	if slices.Contains(raw, -1) {
		closeAll(raw)
		return nil, laneFDs{}, fmt.Errorf("taking the descriptors from the rendezvous: %w", err)
	}
	record, at, err := placeFDs(raw, fds.ID{}) // the record's own file, below
	return record, at, err
}

// bootEnv is the value of EnvBoot for b: its settings in JSON, or, over max bytes (0: no
// bound), the part of them that says which lane it is and where its record is.
func bootEnv(b Boot, max int) (string, error) {
	settings, err := json.Marshal(b)
	if err != nil {
		return "", err
	}
	if max > 0 && len(settings) > max {
		settings, err = json.Marshal(Boot{Version: b.Version, Lane: b.Lane, Incarnation: b.Incarnation, Shm: b.Shm, ShmKey: b.ShmKey})
	}
	return string(settings), err
}

// readBoot reads the boot record from fd and closes it: a task never finds it open.
func readBoot(fd int) ([]byte, error) {
	f := os.NewFile(uintptr(fd), "knit-boot")
	defer f.Close()
	record, err := shm.ReadSealed(f, MaxBootRecord)
	if err != nil {
		return nil, fmt.Errorf("reading the boot record: %w", err)
	}
	return record, nil
}

// placeFDs takes what a host sends a lane that cannot inherit: the boot record, the region,
// the completion eventfd and perhaps a shared submit ring, in that order. It reads the record
// and closes it, then moves the others to FDRegion, FDDone and FDSteal, over the host's
// placeholders there (ours, and the record's own file, which a host puts there for a lane
// it starts) or onto the number if it is free. A number the Go runtime took before the lane
// could (its cgroup files, the netpoller's epoll descriptor: the lowest free numbers of a
// process whose wrapper closed the placeholders) is not taken from it: the descriptor stays
// where the kernel put it, and the lane serves from there. Placeholders left over are closed.
func placeFDs(raw []int, ours ...fds.ID) ([]byte, laneFDs, error) {
	if len(raw) < 3 || len(raw) > 4 {
		closeAll(raw)
		return nil, laneFDs{}, fmt.Errorf("%d descriptors from the host, want 3 or 4", len(raw))
	}
	if id, ok := fds.Of(raw[0]); ok {
		ours = append(ours, id)
	}
	record, err := readBoot(raw[0])
	if err != nil {
		closeAll(raw[1:])
		return nil, laneFDs{}, err
	}
	at := []int{-1, -1, -1}
	targets := []int{FDRegion, FDDone, FDSteal}
	for i, fd := range raw[1:] {
		if at[i], err = fds.Place(fd, targets[i], ours...); err != nil {
			closeAll(at[:i])
			closeAll(raw[i+1:])
			return nil, laneFDs{}, err
		}
	}
	for i, t := range targets {
		if at[i] != t {
			fds.Drop(t, ours...)
		}
	}
	return record, laneFDs{region: at[0], done: at[1], steal: at[2]}, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
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
		if bt.Index >= MaxTaskIndex {
			return nil, fmt.Errorf("task %q index %d out of range", bt.Name, bt.Index)
		}
		if int(bt.Index) >= len(tasks) {
			tasks = slices.Grow(tasks, int(bt.Index)+1-len(tasks))[:bt.Index+1]
		}
		if tasks[bt.Index] != nil {
			return nil, fmt.Errorf("tasks %q and %q both at index %d", tasks[bt.Index].Name(), bt.Name, bt.Index)
		}
		tasks[bt.Index] = d
	}
	return tasks, nil
}

func durationNS(ns int64) time.Duration { return time.Duration(ns) }

// heartbeat bumps the region's heartbeat counter every period, from a goroutine of its own:
// it beats whatever the tasks do, and stands still only when the whole process does
// (SIGSTOP, a stuck runtime). With pause set, a lane found parked at two beats in a row, not
// rung in between, pauses it (fastpath.BeatPaused) until the executor wakes (beatPause.woke):
// each beat of an idle lane cost its runtime about eight thread wake-ups, 0.05–0.1 % of a
// core a lane (docs/benchmarks.md). It returns a function that stops it.
func heartbeat(r *fastpath.Region, period time.Duration, pause *beatPause) (stop func()) {
	if period <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(period)
		defer t.Stop()
		wake := r.LaneWake()
		var n, rings uint32
		parked := false // at the last beat
		for {
			n = (n + 1) &^ fastpath.BeatPaused
			r.Heartbeat().Store(n)
			select {
			case <-t.C:
			case <-done:
				return
			}
			if pause == nil {
				continue
			}
			awake, _ := wake.Awake()
			was, before := parked, rings
			parked, rings = !awake, wake.Rings()
			if !was || !parked || rings != before {
				continue
			}
			// The executor reads paused after it marks itself awake, and this reads its
			// awake word after setting paused: one of the two sees the other.
			pause.paused.Store(true)
			if awake, _ := wake.Awake(); awake && pause.paused.CompareAndSwap(true, false) {
				parked = false
				continue
			}
			r.Heartbeat().Store(n | fastpath.BeatPaused)
			t.Stop()
			select {
			case <-pause.resume: // woke took the pause back
			case <-done:
				return
			}
			t.Reset(period)
			parked = false
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// beatPause is how a lane's executor restarts its paused heartbeat.
type beatPause struct {
	paused atomic.Bool
	resume chan struct{}
}

func newBeatPause() *beatPause { return &beatPause{resume: make(chan struct{}, 1)} }

// woke is the executor's Woke: one load on each wake-up, a send when the beat was paused.
func (p *beatPause) woke() {
	if p.paused.Load() && p.paused.CompareAndSwap(true, false) {
		p.resume <- struct{}{}
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
	// deadline and canceled are the causes of a call context's end (Hooks).
	deadline, canceled error
}

func newAbortWatch(r *fastpath.Region) *abortWatch {
	w := &abortWatch{region: r, bit: -1, done: make(chan struct{}), deadline: ErrCallerDeadline, canceled: ErrCallerCanceled}
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
		ctx, stop = context.WithDeadlineCause(ctx, time.Unix(0, deadline), w.deadline)
	}
	bits, i := w.bitmap(bit)
	if i < 0 || i >= bits.Len() {
		return ctx, stop
	}
	ctx, cancel := context.WithCancelCause(ctx)
	abort := func() { cancel(w.canceled) }
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

// placeholderText is the content of the sealed file a host puts on fds 3 to 5 of a spare
// that connects for its socket (SharedMemory Named), to keep those numbers for the
// descriptors it will send: a file a spare can tell from any the Go runtime opened there.
const placeholderText = "knit: descriptor number kept for a lane"

// awaitAssignment makes a spare a lane: it waits for its assignment (Launcher.Assign) —
// the boot record, the region, the completion eventfd and perhaps a shared submit ring, as
// descriptors — puts the descriptors where a lane started directly finds them (placeFDs)
// and returns the record. The socket is on FDRegion, and the host put it on FDDone and
// FDSteal too, to keep those numbers for the descriptors to come; with SharedMemory Named,
// the spare connects for it (EnvSpare is "name:key") and puts it on FDRegion, over the
// host's placeholder there or if the number is free.
func awaitAssignment() ([]byte, laneFDs, error) {
	sock := FDRegion
	var ours []fds.ID
	if v := os.Getenv(EnvSpare); v != "1" { // SharedMemory Named: connect for the socket
		name, key, _ := strings.Cut(v, ":")
		if shm.IsSealedWith(FDRegion, []byte(placeholderText)) {
			id, _ := fds.Of(FDRegion)
			ours = append(ours, id)
		}
		conn, err := shm.Dial(name, key)
		if err != nil {
			return nil, laneFDs{}, fmt.Errorf("connecting to the host: %w", err)
		}
		fd, err := unix.Dup(int(conn.Fd()))
		conn.Close()
		if err != nil {
			return nil, laneFDs{}, err
		}
		if sock, err = fds.Place(fd, FDRegion, ours...); err != nil {
			unix.Close(fd)
			return nil, laneFDs{}, err
		}
	}
	sockID, _ := fds.Of(sock)
	ours = append(ours, sockID)
	// Tell the host this process is initialised: from now on taking it costs one message.
	if _, err := unix.Write(sock, []byte{1}); err != nil {
		return nil, laneFDs{}, fmt.Errorf("reporting ready: %w", err)
	}
	buf := make([]byte, 16)
	oob := make([]byte, unix.CmsgSpace(4*4))
	var n, oobn int
	var err error
	for {
		n, oobn, _, _, err = unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	switch {
	case err != nil:
		return nil, laneFDs{}, fmt.Errorf("reading the assignment: %w", err)
	case n == 0 && oobn == 0:
		return nil, laneFDs{}, errNotNeeded
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, laneFDs{}, fmt.Errorf("assignment without descriptors (%v)", err)
	}
	raw, err := unix.ParseUnixRights(&msgs[0])
	if err != nil {
		closeAll(raw)
		return nil, laneFDs{}, fmt.Errorf("assignment with bad descriptors: %w", err)
	}
	// The region replaces the socket on FDRegion.
	record, at, err := placeFDs(raw, ours...)
	if err != nil {
		return nil, laneFDs{}, err
	}
	fds.Drop(sock, sockID) // if nothing replaced it
	_ = os.Unsetenv(EnvSpare)
	return record, at, nil
}
