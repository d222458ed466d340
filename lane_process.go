package knit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/fastpath"
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
	ready  chan struct{} // closed once the lane has reported ready
	exited chan struct{} // closed once the process has been waited for
	gone   chan struct{} // closed once its calls are settled and its region unmapped
	spare  bool          // it was a spare: initialised already, it is ready within Liveness

	killMu sync.Mutex
	killed lifecycle.Exit // why the host killed it, if it did

	// abort bits, under lane.mu: owner[bit] names the call holding the bit (abortOwner).
	abortOwner []uint64
	abortFree  []int32

	final fastpath.StatsSnapshot // counters at the end, once the region is unmapped
}

// startProcess creates the region and starts the lane process. It returns once the
// process has started; ready is closed when it reports ready.
func (l *lane) startProcess() error {
	cfg := l.p.cfg
	layout := fastpath.Layout{Inline: cfg.Payload.Inline, Arena: cfg.Payload.Arena, AbortBits: fastpath.DefaultAbortBits}
	pl := &procLane{ready: make(chan struct{}), exited: make(chan struct{}), gone: make(chan struct{})}
	var err error
	if cfg.Process.SharedMemory == Named {
		pl.mp, err = shm.CreateNamed(layout.Size())
	} else {
		pl.mp, err = shm.CreateMemfd(fmt.Sprintf("knit-lane-%d", l.idx), layout.Size())
	}
	if err != nil {
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
	for i := range layout.AbortBits {
		pl.abortFree = append(pl.abortFree, int32(layout.AbortBits-1-i))
	}
	pl.abortOwner = make([]uint64, layout.AbortBits)
	l.proc = pl
	l.req, l.ret = l.region.Requests().Producer(), l.region.Returns().Consumer()
	l.wake, l.done = l.region.LaneWake(), l.region.Returns().Completion()
	l.laneBell, l.doneBell = fastpath.FutexBell{}, fastpath.EventBell{FD: pl.efd}
	l.reaper = true

	record, err := l.bootRecord(layout)
	if err != nil {
		l.release()
		return l.startErr("%v", err)
	}
	regionFile := pl.mp.File()
	if l.p.cfg.Process.SharedMemory == Named {
		regionFile = nil
	}
	// A restart takes a spare — a process that has exec'd and initialised already — when
	// one is waiting; a first start, or a restart with none, spawns.
	if sp := l.p.takeSpare(l.inc); sp != nil {
		if err := sp.assign(record, regionFile, pl.efd.File()); err == nil {
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
		cmd, err := l.p.laneCommand([]*os.File{regionFile, pl.efd.File()}, lifecycle.EnvBoot+"="+string(record))
		if err != nil {
			l.release()
			return l.startErr("%v", err)
		}
		if pl.child, err = startChild(cmd, newLaneOutput(l.p.root, l.idx)); err != nil {
			l.release()
			return l.startErr("spawn %s: %v", cmd.Path, err)
		}
	}
	l.started = true // from here on the lane ends through waitProcess
	l.debug("lane process started", zap.Int("pid", pl.pid))
	go l.waitProcess()
	go l.reap()
	return nil
}

func (l *lane) startErr(format string, args ...any) error {
	return &Error{Code: CodeStartupFailed, Lane: l.idx, Message: fmt.Sprintf(format, args...)}
}

// bootRecord is the lane's boot record.
func (l *lane) bootRecord(layout fastpath.Layout) ([]byte, error) {
	cfg := l.p.cfg
	boot := lifecycle.Boot{
		Version: fastpath.Version, Lane: uint32(l.idx), Incarnation: uint32(l.inc),
		MaxCall: cfg.Payload.MaxCall, Spin: int64(cfg.LaneSpin), Park: int64(time.Second),
		Beat:  int64(cfg.Liveness / beatsPerLiveness),
		Epoch: l.p.epoch.UnixNano(), Debug: l.p.laneDebug, PanicCrash: cfg.PanicCrashesLane,
	}
	if cfg.Process.SharedMemory == Named {
		boot.Shm = strings.TrimPrefix(l.proc.mp.Name(), "/dev/shm/")
	}
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
}

func startChild(cmd *exec.Cmd, out *laneOutput) (*child, error) {
	cmd.Stdout, cmd.Stderr = out.writer(false), out.writer(true)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, pid: cmd.Process.Pid, output: out, waited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.waited)
	}()
	return c, nil
}

// laneEnv is a lane's scrubbed environment: KNIT_* variables and what allow names.
func laneEnv(allow []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KNIT_") && !strings.HasPrefix(kv, lifecycle.EnvBoot+"=") && !strings.HasPrefix(kv, lifecycle.EnvLane+"=") && !strings.HasPrefix(kv, lifecycle.EnvSpare+"=") {
			env = append(env, kv)
		}
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
		_ = l.proc.mp.Unlink() // a named mapping: the lane has opened it; no name outlives it
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
	if pl.killed.Startup == 0 && pl.killed.HardTimeout == "" && pl.killed.Corrupt == nil && pl.killed.Unresponsive == "" {
		pl.killed = why
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
	close(pl.exited)
	pl.killMu.Lock()
	x := pl.killed
	pl.killMu.Unlock()
	x.Lane = l.idx
	x.Stopping = l.state.Load() == laneStopping
	x.Ready = l.region.Boot().Load() == fastpath.BootReady
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
	x.Tail = pl.output.tail()
	pl.output.mu.Lock()
	x.Failure = pl.output.failure
	pl.output.mu.Unlock()
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

// allocAbort gives a cancellable call an abort bit (-1 when all are taken: the call can
// then be settled by its caller but not interrupted in the lane). Called with mu held.
func (pl *procLane) allocAbort(fn, id uint32) int32 {
	n := len(pl.abortFree)
	if n == 0 {
		return -1
	}
	bit := pl.abortFree[n-1]
	pl.abortFree = pl.abortFree[:n-1]
	pl.abortOwner[bit] = abortOwner(fn, id)
	return bit
}

// abortOwner names a call by task and record: record ids are per task.
func abortOwner(fn, id uint32) uint64 { return uint64(fn)<<32 | uint64(id) + 1 }

// raiseAbort sets a call's abort bit and rings the lane's abort doorbell, if the bit still
// belongs to the call.
func (l *lane) raiseAbort(bit int32, fn, id uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.proc == nil || l.unmapped || bit < 0 || int(bit) >= len(l.proc.abortOwner) || l.proc.abortOwner[bit] != abortOwner(fn, id) {
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
	if int(bit) >= len(l.proc.abortOwner) || l.proc.abortOwner[bit] != abortOwner(fn, id) {
		return fmt.Errorf("%w: abort bit %d does not belong to call %d", fastpath.ErrCorrupt, bit, id)
	}
	l.proc.abortOwner[bit] = 0
	l.region.Aborts().Clear(int(bit))
	l.proc.abortFree = append(l.proc.abortFree, bit)
	return nil
}

// laneOutput re-logs a lane's stdout and stderr line by line and keeps the last lines of
// stderr for crash reports.
type laneOutput struct {
	log   *zap.Logger // with the lane's fields: plain lines
	root  *zap.Logger // the pool's root logger: the lane's own JSON log lines
	mu    sync.Mutex
	lines []string // ring of the last tailKeep stderr lines
	next  int
	full  bool
	// failure is the first line in which the Go runtime announced a panic or fatal error:
	// the goroutine dump after it can push it out of the tail.
	failure string
}

const tailKeep = 64

func newLaneOutput(root *zap.Logger, lane int) *laneOutput {
	o := &laneOutput{root: root, lines: make([]string, tailKeep)}
	o.relabel(lane)
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

func (o *laneOutput) line(s string, stderr bool) {
	if e, ok := logging.ParseLaneLine(s); ok {
		// The lane's own log line, re-emitted on the host's timeline. It stays out of the
		// crash tail: the lane prints what matters there in plain text too.
		e.Emit(o.root)
		return
	}
	if stderr {
		o.mu.Lock()
		o.lines[o.next] = s
		o.next = (o.next + 1) % tailKeep
		o.full = o.full || o.next == 0
		if o.failure == "" && (strings.HasPrefix(s, "panic: ") || strings.HasPrefix(s, "fatal error: ")) {
			o.failure = s
		}
		log := o.log
		o.mu.Unlock()
		log.Warn("lane stderr", zap.String("line", s))
		return
	}
	o.mu.Lock()
	log := o.log
	o.mu.Unlock()
	log.Info("lane stdout", zap.String("line", s))
}

func (o *laneOutput) tail() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.full {
		return append([]string(nil), o.lines[:o.next]...)
	}
	return append(append([]string(nil), o.lines[o.next:]...), o.lines[:o.next]...)
}

// lineWriter splits what a lane writes into lines.
type lineWriter struct {
	out    *laneOutput
	stderr bool
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		w.out.line(string(w.buf[:i]), w.stderr)
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 64<<10 { // an endless line is still logged, in pieces
		w.out.line(string(w.buf), w.stderr)
		w.buf = w.buf[:0]
	}
	return len(p), nil
}
