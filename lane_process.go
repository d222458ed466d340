package knit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/cgroup"
	"github.com/knitgo/knit/internal/futex"
	"github.com/knitgo/knit/internal/logging"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/lifecycle"
)

// procLane is what a process lane adds to a lane: the child, its mapping and doorbell, and
// what the host learns about its end.
type procLane struct {
	*child
	mp     *shm.Mapping
	efd    *futex.EventFD
	rv     *shm.Rendezvous // SharedMemory Named: where the lane collects mp and efd
	handed chan struct{}   // closed once the rendezvous is over (nil without one)
	ready  chan struct{}   // closed once the lane has reported ready
	exited chan struct{}   // closed once the process has been waited for
	gone   chan struct{}   // closed once its calls are settled and its region unmapped
	spare  bool            // it was a spare: initialised already, it is ready within Liveness

	killMu sync.Mutex
	killed lifecycle.Exit // why the host killed it, if it did

	aborts abortBits // under lane.mu

	final fastpath.StatsSnapshot // counters at the end, once the region is unmapped
}

// startProcess creates the region and starts the lane process. It returns once the
// process has started; ready is closed when it reports ready.
//
// The region is a sealed memfd in both shared-memory modes (shm.CreateMemfd): a lane can
// write it but never resize it, so nothing a lane does to the file can make the host's
// mapping fault. With SharedMemory Named the lane inherits no descriptor: it collects the
// memfd and the eventfd from a rendezvous socket named in its boot record (shm.Rendezvous).
func (l *lane) startProcess() error {
	cfg := l.p.cfg
	layout := fastpath.Layout{Inline: cfg.Payload.Inline, Arena: cfg.Payload.Arena, AbortBits: fastpath.DefaultAbortBits}
	pl := &procLane{ready: make(chan struct{}), exited: make(chan struct{}), gone: make(chan struct{})}
	if l.idx == 0 && l.inc == 0 {
		l.p.sweepShm()
	}
	var err error
	if pl.mp, err = shm.CreateMemfd(fmt.Sprintf("knit-lane-%d", l.idx), layout.Size()); err != nil {
		return l.startErr("shared memory: %v", err)
	}
	if l.region, err = fastpath.NewRegion(pl.mp.Bytes(), layout, uint32(l.idx), uint32(l.inc), l.p.epoch.UnixNano()); err != nil {
		pl.mp.Close()
		return l.startErr("region: %v", err)
	}
	l.debugRegion(cfg.Process.SharedMemory.String())
	if pl.efd, err = futex.NewEventFD(); err != nil {
		pl.mp.Close()
		return l.startErr("eventfd: %v", err)
	}
	pl.aborts = newAbortBits(layout.AbortBits)
	l.proc = pl
	l.req, l.ret = l.region.Requests().Producer(), l.region.Returns().Consumer()
	l.wake, l.done = l.region.LaneWake(), l.region.Returns().Completion()
	l.laneBell, l.doneBell = fastpath.FutexBell{}, fastpath.EventBell{FD: pl.efd}
	l.reaper = true
	if s := l.p.shared; s != nil {
		l.cid = s.join(l)
	}

	// A restart takes a spare — a process that has exec'd and initialised already — when
	// one is waiting; a first start, or a restart with none, spawns. A spare receives its
	// descriptors on its socket, whatever the shared-memory mode.
	if sp := l.p.takeSpare(l.inc); sp != nil {
		record, err := l.bootRecord("")
		if err == nil {
			err = sp.assign(record, pl.mp.File(), pl.efd.File(), l.stealFiles()...)
		}
		if err == nil {
			pl.child, pl.spare = sp.child, true
			pl.output.relabel(l.idx)
			l.debug("spare process assigned")
		} else {
			l.debug("spare process refused its assignment: spawning", zap.Int("pid", sp.pid), zap.Error(err))
			sp.kill()
		}
		l.p.refillSpares()
	}
	if pl.child == nil {
		if err := l.spawn(); err != nil {
			l.release()
			if s := l.p.shared; s != nil {
				s.leave(l)
			}
			return err
		}
	}
	l.started = true // from here on the lane ends through waitProcess
	l.debug("lane process started", zap.Int("pid", pl.pid))
	go l.waitProcess()
	go l.reap()
	return nil
}

// spawn starts a new lane process: the region and eventfd on fds 3 and 4, or, with
// SharedMemory Named, a rendezvous that hands them over once the process connects.
func (l *lane) spawn() error {
	pl := l.proc
	files := append([]*os.File{pl.mp.File(), pl.efd.File()}, l.stealFiles()...)
	rvName := ""
	if l.p.cfg.Process.SharedMemory == Named {
		rv, err := shm.Listen()
		if err != nil {
			return l.startErr("shared memory: %v", err)
		}
		pl.rv, files, rvName = rv, nil, rv.Name()
	}
	fail := func(err error) error {
		if pl.rv != nil {
			_ = pl.rv.Close()
		}
		return err
	}
	record, err := l.bootRecord(rvName)
	if err != nil {
		return fail(l.startErr("%v", err))
	}
	cmd, err := l.p.laneCommand(files, lifecycle.EnvBoot+"="+string(record))
	if err != nil {
		return fail(l.startErr("%v", err))
	}
	if pl.child, err = l.p.spawnChild(cmd, newLaneOutput(l.p.root, l.idx)); err != nil {
		return fail(l.startErr("spawn %s: %v", cmd.Path, err))
	}
	if pl.rv != nil {
		pl.handed = make(chan struct{})
		go l.handOver()
	}
	return nil
}

// handOver gives the region and eventfd to the lane process through the rendezvous: to the
// first process that connects, if it is the lane. A failed hand-over before the lane has
// ended kills it; it fails its start.
func (l *lane) handOver() {
	pl := l.proc
	defer close(pl.handed)
	files := append([]*os.File{pl.mp.File(), pl.efd.File()}, l.stealFiles()...)
	err := pl.rv.Hand(time.Now().Add(l.p.cfg.StartupTimeout), l.checkPeer, files...)
	if err == nil {
		l.debug("shared memory handed over", zap.String("rendezvous", pl.rv.Name()))
		return
	}
	select {
	case <-pl.waited: // the lane ended first: waitProcess closed the rendezvous
	default:
		l.kill(lifecycle.Exit{Handoff: err})
	}
}

// checkPeer admits the lane process (or a descendant) to the lane's rendezvous.
func (l *lane) checkPeer(p shm.Peer) error { return peerCheck(l.proc.pid)(p) }

// peerCheck admits the process that connected to a rendezvous meant for process pid: it must
// run as this host's user and be pid or one of its descendants (a wrapper in Prefix may
// fork, or start it in a new pid namespace: a child namespace's processes keep a pid here).
// Only a peer whose pid the kernel cannot map into this host's pid namespace (reported as 0:
// the lane was started outside the host's process tree) is admitted on the user alone; no
// lane can arrange that for itself, as the namespaces it can create are children of its own.
func peerCheck(pid int) func(shm.Peer) error {
	return func(p shm.Peer) error {
		if p.UID != os.Geteuid() {
			return fmt.Errorf("peer runs as uid %d, the host as %d", p.UID, os.Geteuid())
		}
		if p.PID == 0 || descendsFrom(p.PID, pid) {
			return nil
		}
		return fmt.Errorf("peer pid %d is not lane process %d or one of its descendants", p.PID, pid)
	}
}

// descendsFrom reports whether pid is ancestor or one of its descendants, following parent
// pids through /proc.
func descendsFrom(pid, ancestor int) bool {
	for range 64 {
		if pid == ancestor {
			return true
		}
		if pid <= 1 {
			return false
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		// pid (comm) state ppid ...: comm may hold anything but ends at the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if i < 0 || len(f) < 2 {
			return false
		}
		if pid, err = strconv.Atoi(f[1]); err != nil {
			return false
		}
	}
	return false
}

// sweepShm removes what dead hosts left in /dev/shm (see SweepSharedMemory).
func (p *Pool) sweepShm() {
	removed, err := shm.Sweep()
	if len(removed) > 0 {
		p.log.Info("removed shared-memory names of dead hosts", zap.Strings("names", removed))
	}
	if err != nil {
		p.log.Debug("sweeping shared-memory names of dead hosts", zap.Error(err))
	}
}

// SweepSharedMemory removes the /dev/shm/knit-<pid>-… names that knit hosts which have died
// left behind, and returns them. A host names its rendezvous sockets (SharedMemory Named)
// that way and removes each as soon as its lane has connected, or when the lane ends; a host
// killed in between cannot. Every NewPool of process lanes sweeps first, so a later pool
// cleans up after a dead one; call this to clean up without starting a pool. It only
// removes names owned by this user whose pid names no living process (a pid reused since
// protects its dead host's names until it ends too).
func SweepSharedMemory() ([]string, error) { return shm.Sweep() }

func (l *lane) startErr(format string, args ...any) error {
	return &Error{Code: CodeStartupFailed, Lane: l.idx, Message: fmt.Sprintf(format, args...)}
}

// parkSafetyNet bounds a parked process lane's sleep. The doorbell protocol loses no wake,
// and the watchdog rings a parked lane that has calls waiting (ringStalled), so this only
// matters if both failed; every expiry costs an idle lane a wake-up and its runtime a burst
// of polling, which at 1 s was most of an idle pool's CPU (docs/benchmarks.md).
const parkSafetyNet = 10 * time.Second

// bootRecord is the lane's boot record; rendezvous names where it collects its descriptors
// ("": it has them).
func (l *lane) bootRecord(rendezvous string) ([]byte, error) {
	cfg := l.p.cfg
	boot := lifecycle.Boot{
		Version: fastpath.Version, Lane: uint32(l.idx), Incarnation: uint32(l.inc),
		MaxCall: cfg.Payload.MaxCall, Spin: int64(cfg.LaneSpin), Park: int64(parkSafetyNet),
		Beat:  int64(cfg.Liveness / beatsPerLiveness),
		Epoch: l.p.epoch.UnixNano(), Debug: l.p.laneDebug, PanicCrash: cfg.PanicCrashesLane,
		Carry: cfg.Propagator != nil, Timed: l.p.obs.timed(),
		Shm: rendezvous, Limits: l.p.limits.boot,
	}
	boot.Sandbox = laneSandbox(cfg)
	boot.Steal, boot.Consumer = l.cid >= 0, l.cid
	for _, d := range l.p.defs {
		boot.Tasks = append(boot.Tasks, lifecycle.BootTask{Name: d.Name(), Index: d.Index(), Fingerprint: d.Fingerprint()})
	}
	return json.Marshal(boot)
}

// laneCommand is a lane process's command: the configured binary behind its prefix, a
// scrubbed environment plus extra, files from fd 3 on, its own process group, and death
// with the host.
func (p *Pool) laneCommand(files []*os.File, extra string) (*exec.Cmd, error) {
	cfg := p.cfg
	argv := cfg.Process.Command
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("cannot find this executable: %w", err)
		}
		argv = []string{exe}
	}
	argv = append(append([]string(nil), cfg.Process.Prefix...), argv...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(laneEnv(cfg.Process.Env), extra)
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second // a grandchild holding the output pipes open cannot hang Wait
	return cmd, nil
}

// child is a started lane process.
type child struct {
	cmd    *exec.Cmd
	pid    int
	output *laneOutput
	waited chan struct{} // closed once the process has been waited for
	err    error         // what Wait returned
	cg     *cgroup.Group // its cgroup, if the pool makes them (limits.go)
}

func startChild(cmd *exec.Cmd, out *laneOutput) (*child, error) {
	cmd.Stdout, cmd.Stderr = out.writer(false), out.writer(true)
	if err := cmd.Start(); err != nil {
		out.close()
		return nil, err
	}
	c := &child{cmd: cmd, pid: cmd.Process.Pid, output: out, waited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		out.close() // Wait has waited for the pipe readers: no line comes after this
		close(c.waited)
	}()
	return c, nil
}

// laneEnv is a lane's scrubbed environment: KNIT_* variables, the host's PATH (so that a
// task can run programs by name) and what allow names; an entry of allow naming PATH
// replaces the host's.
func laneEnv(allow []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KNIT_") && !strings.HasPrefix(kv, lifecycle.EnvBoot+"=") && !strings.HasPrefix(kv, lifecycle.EnvLane+"=") && !strings.HasPrefix(kv, lifecycle.EnvSpare+"=") {
			env = append(env, kv)
		}
	}
	path := true
	for _, a := range allow {
		if name, _, _ := strings.Cut(a, "="); name == "PATH" {
			path = false
		}
	}
	if v, ok := os.LookupEnv("PATH"); ok && path {
		env = append(env, "PATH="+v)
	}
	// The race runtime's options say how the binary runs, like PATH where it finds others
	// (a race-built lane otherwise sleeps 1 s when it exits).
	if v, ok := os.LookupEnv("GORACE"); ok {
		env = append(env, "GORACE="+v)
	}
	for _, a := range allow {
		if strings.Contains(a, "=") {
			env = append(env, a)
		} else if v, ok := os.LookupEnv(a); ok {
			env = append(env, a+"="+v)
		}
	}
	return append(env, lifecycle.EnvLane+"=1")
}

// awaitReady waits for the lane to report ready, to exit, or for the startup timeout.
func (l *lane) awaitReady() error {
	timeout := l.p.cfg.StartupTimeout
	if l.proc.spare && l.p.cfg.Liveness > 0 {
		timeout = min(timeout, l.p.cfg.Liveness)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-l.proc.ready:
		return nil
	case <-l.ended:
	case <-t.C:
		l.kill(lifecycle.Exit{Startup: timeout})
		<-l.ended
	}
	return l.endError()
}

// kill ends the lane's whole process group; why says what the host will report.
func (l *lane) kill(why lifecycle.Exit) {
	pl := l.proc
	pl.killMu.Lock()
	if pl.killed.Startup == 0 && pl.killed.Handoff == nil && pl.killed.HardTimeout == "" && pl.killed.Corrupt == nil && pl.killed.Unresponsive == "" {
		pl.killed = why
		l.p.obs.killed(l.idx, "SIGKILL", killReason(why))
	}
	pl.killMu.Unlock()
	_ = syscall.Kill(-pl.pid, syscall.SIGKILL)
}

// waitProcess waits for the lane process to end, classifies the end, and settles every
// call the lane held. The region is unmapped only after the process has exited and the
// reaper has let go of it.
func (l *lane) waitProcess() {
	pl := l.proc
	<-pl.waited
	werr := pl.err
	_ = syscall.Kill(-pl.pid, syscall.SIGKILL) // the lane's own children go with it
	if pl.rv != nil {                          // a lane that never connected: its name goes now
		_ = pl.rv.Close()
		<-pl.handed
	}
	close(pl.exited)
	pl.killMu.Lock()
	x := pl.killed
	pl.killMu.Unlock()
	x.Lane = l.idx
	x.Stopping = l.state.Load() == laneStopping
	// Ready is what the host saw (the reaper closed ready), not the boot word now: a lane
	// may have rewritten that, or the whole region, before it went.
	select {
	case <-pl.ready:
		x.Ready = true
	default:
	}
	x.Status, x.Signal = -1, 0
	if ps := pl.cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			x.Signal = ws.Signal()
		} else {
			x.Status = ps.ExitCode()
		}
	}
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) {
		x.Err = werr
	}
	if !x.Ready {
		x.Fatal = l.region.Fatal()
	}
	x.Tail, x.Failure, x.Crash = pl.output.report()
	l.limitsExit(&x) // its cgroup goes, with every process left in it
	l.debug("lane process reaped", zap.Int("pid", pl.pid), zap.Int("status", x.Status), zap.Stringer("signal", x.Signal))
	e := lifecycle.Classify(x)
	l.normal = e.Code == CodeWorkerExited && x.Status == 0
	l.close(e, true)
	l.wakeReaper()
	<-l.reaped
	pl.final = l.region.Stats().Snapshot()
	l.release()
	close(pl.gone)
}

// release unmaps the region and closes the doorbell.
func (l *lane) release() {
	pl := l.proc
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unmapped = true
	_ = pl.efd.Close()
	_ = pl.mp.Close()
}

// ready reports, from the reaper, whether the lane has booted; it closes proc.ready once.
func (l *lane) checkReady() {
	select {
	case <-l.proc.ready:
	default:
		if l.region.Boot().Load() == fastpath.BootReady {
			close(l.proc.ready)
		}
	}
}

// endError is the lane's classified end, once ended is closed.
func (l *lane) endError() *Error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.endErr
}

// raiseAbort sets a call's abort bit and rings the lane's abort doorbell, if the bit still
// belongs to the call.
func (l *lane) raiseAbort(bit int32, fn, id uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.proc == nil || l.unmapped || !l.proc.aborts.holds(bit, fn, id) {
		return
	}
	l.raiseAbortLocked(bit)
}

// raiseAbortLocked sets abort bit bit (when it is one: -1 is none) and rings the lane's
// abort doorbell; mu is held.
func (l *lane) raiseAbortLocked(bit int32) {
	if bit < 0 {
		return
	}
	l.region.Aborts().Set(int(bit))
	l.region.AbortWake().Add(1)
	_, _ = futex.Wake(l.region.AbortWake(), 1)
}

// freeAbort returns a settled call's abort bit. A bit the call does not hold means the lane
// broke the protocol.
func (l *lane) freeAbort(bit int32, fn, id uint32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.proc.aborts.holds(bit, fn, id) {
		return fmt.Errorf("%w: abort bit %d does not belong to call %d", fastpath.ErrCorrupt, bit, id)
	}
	l.proc.aborts.release(bit)
	l.region.Aborts().Clear(int(bit))
	return nil
}

// laneOutput relays a lane's stdout and stderr to the pool's logger, line by line, and
// keeps what a crash report needs: the last stderr lines and the Go runtime's account of a
// crash (lifecycle.CrashReport).
//
// A lane must never wait for the host's log sink: a sink that blocks (a full pipe nobody
// reads, a slow remote writer) would block the lane's writes to its stderr, then the lane,
// its calls and Close. So the lines the pipe readers split are handed to a relay goroutine
// through a bounded queue; the pipes are always drained, and a line that finds the queue
// full is dropped and counted. The relay reports drops ("lane output: lines dropped") as
// soon as the sink takes a line again, and once more when the output ends. Crash
// bookkeeping happens before the queue: it never loses a line.
type laneOutput struct {
	root    *zap.Logger // the pool's root logger: the lane's own JSON log lines
	queue   chan outLine
	relayed chan struct{} // closed when the relay goroutine has ended
	dropped atomic.Uint64 // lines dropped, in all
	pending atomic.Uint64 // lines dropped and not reported yet

	mu    sync.Mutex
	log   *zap.Logger // with the lane's fields: plain lines
	lines []string    // ring of the last tailKeep stderr lines
	next  int
	full  bool
	crash lifecycle.CrashReport
}

// outLine is one line waiting for the relay: a plain line (with the logger and level it goes
// to) or one of the lane's own log entries.
type outLine struct {
	log    *zap.Logger
	level  zapcore.Level
	msg    string
	line   string
	entry  logging.LaneEntry
	parsed bool
}

const (
	tailKeep = 64
	// outQueue is how many lines may wait for a slow sink, per lane process: with lines
	// cut at logging.MaxLaneText, at most 2 MiB.
	outQueue = 512
)

func newLaneOutput(root *zap.Logger, lane int) *laneOutput {
	o := &laneOutput{root: root, lines: make([]string, tailKeep),
		queue: make(chan outLine, outQueue), relayed: make(chan struct{})}
	o.relabel(lane)
	go o.relay()
	return o
}

// relabel names the lane the output belongs to (a spare learns it when it is taken; -1 until
// then).
func (o *laneOutput) relabel(lane int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.log = o.root.Named(logging.Lane).With(zap.Int("lane", lane))
}

func (o *laneOutput) writer(stderr bool) *lineWriter { return &lineWriter{out: o, stderr: stderr} }

// line takes one line from a pipe reader. It never blocks on the logger.
func (o *laneOutput) line(s string, stderr bool) {
	if e, ok := logging.ParseLaneLine(s); ok {
		// The lane's own log line, re-emitted on the host's timeline. It stays out of the
		// crash tail: the lane prints what matters there in plain text too.
		o.enqueue(outLine{entry: e, parsed: true})
		return
	}
	raw := s
	s = logging.Clean(s, logging.MaxLaneText)
	o.mu.Lock()
	log := o.log
	if !stderr {
		o.mu.Unlock()
		o.enqueue(outLine{log: log, level: zapcore.InfoLevel, msg: "lane stdout", line: s})
		return
	}
	o.lines[o.next] = s
	o.next = (o.next + 1) % tailKeep
	o.full = o.full || o.next == 0
	// The goroutine dump after a panic or fatal error is a hundred lines of little use in
	// the console: the crash error carries the faulting goroutine's frames; the dump goes
	// to Debug. The report reads the raw line (its frames' file lines start with a tab);
	// Classify cleans what it keeps.
	level := zapcore.WarnLevel
	if o.crash.Line(raw) {
		level = zapcore.DebugLevel
	}
	o.mu.Unlock()
	o.enqueue(outLine{log: log, level: level, msg: "lane stderr", line: s})
}

func (o *laneOutput) enqueue(l outLine) {
	select {
	case o.queue <- l:
	default:
		o.dropped.Add(1)
		o.pending.Add(1)
	}
}

// relay logs the queued lines until the output ends (close), then reports drops still
// unreported.
func (o *laneOutput) relay() {
	defer close(o.relayed)
	for l := range o.queue {
		switch {
		case l.parsed:
			l.entry.Emit(o.root)
		default:
			if ce := l.log.Check(l.level, l.msg); ce != nil {
				ce.Write(zap.String("line", l.line))
			}
		}
		o.reportDrops()
	}
	o.reportDrops()
}

func (o *laneOutput) reportDrops() {
	if n := o.pending.Swap(0); n > 0 {
		o.mu.Lock()
		log := o.log
		o.mu.Unlock()
		log.Warn("lane output: lines dropped: the log sink is too slow", zap.Uint64("dropped", n),
			zap.Uint64("dropped_total", o.dropped.Load()))
	}
}

// close ends the relay once the pipe readers are done (the process has been waited for).
// It does not wait for the relay: a sink that blocks keeps only the relay goroutine.
func (o *laneOutput) close() { close(o.queue) }

// report returns the last stderr lines, the runtime's failure line and its crash account.
func (o *laneOutput) report() (tail []string, failure string, crash []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.full {
		tail = append([]string(nil), o.lines[:o.next]...)
	} else {
		tail = append(append([]string(nil), o.lines[o.next:]...), o.lines[:o.next]...)
	}
	return tail, o.crash.Failure(), o.crash.Crash()
}

// lineWriter splits what a lane writes into lines.
type lineWriter struct {
	out    *laneOutput
	stderr bool
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	// Only the new bytes are searched: a lane writing a long line a byte at a time costs
	// the host linear time, not quadratic.
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf = append(w.buf, p...)
			break
		}
		w.buf = append(w.buf, p[:i]...)
		w.out.line(string(w.buf), w.stderr)
		w.buf, p = w.buf[:0], p[i+1:]
	}
	for len(w.buf) >= maxLine { // an endless line is still logged, in pieces
		w.out.line(string(w.buf[:maxLine]), w.stderr)
		w.buf = append(w.buf[:0], w.buf[maxLine:]...)
	}
	return n, nil
}

// maxLine is the longest piece of a line the relay takes at once.
const maxLine = 64 << 10

// stealFiles is the shared ring's memfd, for a lane that claims from it.
func (l *lane) stealFiles() []*os.File {
	if l.cid < 0 {
		return nil
	}
	return []*os.File{l.p.shared.mp.File()}
}
