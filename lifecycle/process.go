package lifecycle

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/internal/logging"
	"github.com/knitgo/knit/internal/pgroup"
	"github.com/knitgo/knit/internal/shm"
)

// A Process is one lane process as its host sees it: the process, the rendezvous that hands
// it its descriptors (SharedMemory Named), its output, and why the host killed it, if it
// did. The host's half of the boot protocol: Launcher.Start passes the boot record in a
// sealed memfd on FDBoot or through the rendezvous (Serve reads it), Launcher.Assign sends
// it to a spare on its socket (awaitAssignment reads it).
//
// The zero Process has no process: Kill only records why (a test harness's lane).
type Process struct {
	*child
	lc     *Launcher
	lane   int
	rv     *shm.Rendezvous // SharedMemory Named: where the lane collects its descriptors
	handed chan struct{}   // closed once the rendezvous is over (nil without one)

	killMu sync.Mutex
	killed Exit // why the host killed it, if it did
}

// Start starts lane process b.Lane: files (the region's memfd, the completion eventfd, a
// stealing pool's shared ring) go on fds 3, 4 and 5 and the boot record on FDBoot, or, with
// Named, all of them through a rendezvous named in the settings (EnvBoot), handed over to
// the first process that connects and proves it is the lane (or a descendant of it) with
// the rendezvous's key, which the settings carry too. A failed hand-over kills the process
// (Exit.Handoff). Start returns once the process has started; its errors say which step
// failed.
func (lc *Launcher) Start(b Boot, files []*os.File) (*Process, error) {
	if len(files) > FDBoot-FDRegion {
		return nil, fmt.Errorf("%d descriptors for a lane, at most %d", len(files), FDBoot-FDRegion)
	}
	p := &Process{lc: lc, lane: int(b.Lane)}
	if lc.Named {
		rv, err := shm.Listen()
		if err != nil {
			return nil, fmt.Errorf("shared memory: %v", err)
		}
		p.rv, b.Shm, b.ShmKey = rv, rv.Name(), rv.Key()
	}
	fail := func(err error) (*Process, error) {
		if p.rv != nil {
			_ = p.rv.Close()
		}
		return nil, err
	}
	boot, err := bootFile(b)
	if err != nil {
		return fail(err)
	}
	env, err := bootEnv(b, maxBootEnv)
	if err != nil {
		boot.Close()
		return fail(err)
	}
	var inherit []*os.File
	if p.rv == nil {
		// fds 3 to 5 as given (a missing one is closed in the lane), the record on FDBoot.
		inherit = make([]*os.File, FDBoot-FDRegion+1)
		copy(inherit, files)
		inherit[FDBoot-FDRegion] = boot
	} else {
		// The lane collects everything from the rendezvous, and puts the region, eventfd
		// and ring on fds 3 to 5 if it can: the record's file holds those numbers for them
		// (the Go runtime opens files of its own at the lowest free numbers before main),
		// unless the wrapper closes them.
		inherit = []*os.File{boot, boot, boot}
	}
	cmd, err := lc.command(inherit, EnvBoot+"="+env)
	if err != nil {
		boot.Close()
		return fail(err)
	}
	if p.child, err = lc.spawn(cmd, NewOutput(lc.Root, p.lane)); err != nil {
		boot.Close()
		return fail(fmt.Errorf("spawn %s: %v", cmd.Path, err))
	}
	if p.rv == nil {
		boot.Close() // the lane has its own descriptor of it
		return p, nil
	}
	p.rv.Refused = lc.refused(p.lane, p.pid)
	p.handed = make(chan struct{})
	go p.handOver(b, append([]*os.File{boot}, files...))
	return p, nil
}

// bootFile is b encoded in a sealed memfd (EncodeBoot).
func bootFile(b Boot) (*os.File, error) {
	record, err := EncodeBoot(b)
	if err != nil {
		return nil, err
	}
	f, err := shm.SealedFile("knit-boot", record)
	if err != nil {
		return nil, fmt.Errorf("boot record: %w", err)
	}
	return f, nil
}

// handOver gives the boot record (files[0], which it closes) and the descriptors to the lane
// process through the rendezvous, once it has connected and proved itself (peers it refuses
// are logged, and it waits on for the lane). A failed hand-over — the lane did not connect
// before the startup timeout — kills it; it fails its start.
func (p *Process) handOver(b Boot, files []*os.File) {
	defer close(p.handed)
	defer files[0].Close()
	err := p.rv.Hand(time.Now().Add(p.lc.StartupTimeout), peerCheck(p.pid), files...)
	if err == nil {
		p.lc.debug(b, "shared memory handed over", zap.String("rendezvous", p.rv.Name()))
		return
	}
	select {
	case <-p.waited: // the lane ended first: Wait closed the rendezvous
	default:
		p.Kill(Exit{Handoff: err})
	}
}

// refused logs a peer the rendezvous of lane process pid (lane -1: a spare) refused: the
// first at Warn — a stranger tried to take a lane's shared memory, or a wrapper got in the
// lane's way — the rest at Debug, so that a stranger connecting in a loop cannot flood the
// log. The rendezvous calls it from the one goroutine that accepts.
func (lc *Launcher) refused(lane, pid int) func(shm.Peer, error) {
	n := 0
	return func(peer shm.Peer, err error) {
		n++
		const msg = "shared memory rendezvous: refused a peer, which got nothing; waiting for the lane"
		ce := logging.Debug(lc.Log, msg)
		if n == 1 {
			ce = lc.Log.Check(zap.WarnLevel, msg)
		}
		if ce != nil {
			ce.Write(zap.Int("lane", lane), zap.Int("lane_pid", pid), zap.Int("peer_pid", peer.PID),
				zap.Int("peer_uid", peer.UID), zap.Int("refused", n), zap.Error(err))
		}
	}
}

// debug logs msg at Debug in the lane namespace with lane b's identity.
func (lc *Launcher) debug(b Boot, msg string, fields ...zap.Field) {
	if ce := logging.Debug(lc.Log, msg); ce != nil {
		ce.Write(append([]zap.Field{zap.Int("lane", int(b.Lane)), zap.Int("incarnation", int(b.Incarnation))}, fields...)...)
	}
}

// Assign turns spare sp into lane process b.Lane: one message on its socket with the boot
// record (a sealed memfd) and files as SCM_RIGHTS, which the spare (awaitAssignment) reads
// and puts where a lane started directly finds them. A spare has its socket, so it gets its
// descriptors this way in either shared-memory mode. A spare that refuses it is killed and
// reaped; the caller starts a process instead.
func (lc *Launcher) Assign(sp *Spare, b Boot, files []*os.File) (*Process, error) {
	boot, err := bootFile(b)
	if err == nil {
		err = sp.assign(append([]*os.File{boot}, files...))
		boot.Close() // the message holds its own reference until the spare takes it
	}
	if err != nil {
		sp.kill()
		return nil, err
	}
	sp.output.Relabel(int(b.Lane))
	return &Process{child: sp.child, lc: lc, lane: int(b.Lane)}, nil
}

// PID is the process's id (0: none).
func (p *Process) PID() int {
	if p.child == nil {
		return 0
	}
	return p.pid
}

// Kill ends the process's whole group with SIGKILL; why says what the host will report (the
// first reason given is the one kept).
func (p *Process) Kill(why Exit) {
	p.killMu.Lock()
	if p.killed.Startup == 0 && p.killed.Handoff == nil && p.killed.HardTimeout == "" && p.killed.Corrupt == nil && p.killed.Unresponsive == "" {
		p.killed = why
		if p.lc != nil && p.lc.Killed != nil {
			p.lc.Killed(p.lane, why)
		}
	}
	p.killMu.Unlock()
	p.Signal(syscall.SIGKILL)
}

// Killed is why the host killed the process (the zero Exit: it did not).
func (p *Process) Killed() Exit {
	p.killMu.Lock()
	defer p.killMu.Unlock()
	return p.killed
}

// Signal sends sig to the process's whole group (the stop protocol's SIGTERM and SIGKILL).
func (p *Process) Signal(sig syscall.Signal) { _ = pgroup.Signal(p.PID(), sig) }

// Wait waits for the process to end and returns what the host knows of that end so far: why
// it killed the process, its exit status or signal, and an error Wait met. On the way it
// kills what is left of the process's group (the lane's own children go with it) and
// closes the rendezvous of a lane that never connected. Collect adds the rest once the
// caller has noted what it saw.
func (p *Process) Wait() Exit {
	<-p.waited
	werr := p.err
	p.Signal(syscall.SIGKILL)
	if p.rv != nil { // a lane that never connected: its name goes now
		_ = p.rv.Close()
		<-p.handed
	}
	x := p.Killed()
	x.Status, x.Signal = -1, 0
	if ps := p.cmd.ProcessState; ps != nil {
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
	return x
}

// Collect adds to the Exit of a process that has been waited for what its output and its
// cgroup say: the stderr tail and crash report, the OOM kills and the CPU time used. Its
// cgroup goes, with every process left in it.
func (p *Process) Collect(x *Exit) {
	x.Tail, x.Failure, x.Crash = p.output.Report()
	x.OOMKills = p.dropCgroup(p.lc.Log)
	if ps := p.cmd.ProcessState; ps != nil {
		x.CPUTime = ps.UserTime() + ps.SystemTime()
	}
}
