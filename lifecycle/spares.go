package lifecycle

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/internal/pgroup"
	"github.com/knitgo/knit/internal/shm"
)

// A Spare is a lane process started ahead of need: it has exec'd, initialised the Go runtime
// and every package, reported so, and waits on a unix socket for a boot record. A restart
// that takes one skips the slowest part of a process lane's start (docs/benchmarks.md,
// "Supervision"). The socket is inherited on fd 3, or with SharedMemory Named, where a
// wrapper may close inherited descriptors, connected through a rendezvous (shm.Rendezvous).
type Spare struct {
	*child
	sock *os.File // the host's end of the socket
}

// PID is the spare's process id.
func (sp *Spare) PID() int { return sp.pid }

// Spares is a pool's stock of spare processes. Set its fields before the first Refill; the
// zero Spares starts none, and Take, Close and PIDs work on it.
type Spares struct {
	Launcher *Launcher
	Count    int         // how many to keep ready (ProcessConfig.Spares)
	Log      *zap.Logger // the lifecycle namespace: spares that could not start
	// Max, above Count, makes the stock adaptive: each restart that finds no spare waiting
	// raises the target by one, up to Max, and a minute without such a miss lowers it by
	// one, down to Count. A burst of lane deaths (calls that kill their lanes) then finds
	// spares ready after its first few restarts.
	Max int

	start func() (*Spare, error) // Launcher.startSpare, or a test's

	mu       sync.Mutex
	ready    []*Spare
	starting int
	target   int             // how many to keep now: Count, or more after misses (Max)
	missed   time.Time       // the last restart that found no spare
	booting  map[*Spare]bool // started, not yet initialised: Close kills them too
	closed   bool
	wg       sync.WaitGroup
}

// Take hands a restart a living spare, if one is waiting. A restart that finds none raises
// the adaptive target (Max).
func (s *Spares) Take() (taken *Spare) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if taken == nil && s.Max > s.Count && s.Count > 0 {
			s.missed = time.Now()
			s.target = max(s.target, s.Count)
			if s.target < s.Max {
				s.target++
			}
		}
	}()
	for len(s.ready) > 0 {
		sp := s.ready[0]
		s.ready = s.ready[1:]
		select {
		case <-sp.waited: // it died waiting
			sp.sock.Close()
			sp.dropCgroup(s.Launcher.Log)
		default:
			if !frozen(sp.pid) {
				return sp
			}
			// Stopped: it would make the restart wait for nothing. Close waits for the kill.
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				sp.kill()
			}()
		}
	}
	return nil
}

// Refill starts spares until the target (Count, or more: Max) are ready or starting.
func (s *Spares) Refill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.target < s.Count || s.target > s.Count && time.Since(s.missed) > shrinkSparesAfter {
		s.target = max(s.Count, s.target-1)
	}
	for !s.closed && len(s.ready)+s.starting < s.target {
		s.starting++
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			start := s.start
			if start == nil {
				start = s.startSpare
			}
			sp, err := start()
			s.mu.Lock()
			s.starting--
			switch {
			case err != nil && s.closed:
				// Close stopped it while it initialised: what Close is for, not a failure.
				s.mu.Unlock()
				s.Log.Debug("spare lane process stopped by Close before it was ready", zap.Error(err))
			case err != nil:
				s.mu.Unlock()
				s.Log.Warn("could not start a spare lane process", zap.Error(err))
			case s.closed:
				s.mu.Unlock()
				sp.kill()
			default:
				s.ready = append(s.ready, sp)
				s.mu.Unlock()
			}
		}()
	}
}

// Close ends every spare, and any still starting, before it returns.
func (s *Spares) Close() {
	s.mu.Lock()
	s.closed = true
	ready := s.ready
	s.ready = nil
	for sp := range s.booting {
		_ = pgroup.Signal(sp.pid, syscall.SIGKILL)
	}
	s.mu.Unlock()
	for _, sp := range ready {
		sp.kill()
	}
	s.wg.Wait()
}

// Wait waits until the spares being started have initialised (or failed), and spares being
// killed are reaped.
func (s *Spares) Wait() { s.wg.Wait() }

// PIDs lists the spare processes waiting for a restart.
func (s *Spares) PIDs() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pids []int
	for _, sp := range s.ready {
		pids = append(pids, sp.pid)
	}
	return pids
}

func (s *Spares) startSpare() (*Spare, error) {
	lc := s.Launcher
	var (
		host, theirs *os.File
		rv           *shm.Rendezvous
		files        []*os.File
		env          = EnvSpare + "=1"
	)
	if lc.Named {
		// A wrapper may close inherited descriptors: the spare connects to a rendezvous
		// for its socket instead of inheriting one.
		var err error
		if rv, err = shm.Listen(); err != nil {
			return nil, err
		}
		env = EnvSpare + "=" + rv.Name() + ":" + rv.Key()
		// Should the wrapper let them through, these keep fds 3 to 5 for the socket and
		// the descriptors to come (awaitAssignment).
		ph, err := shm.SealedFile("knit-placeholder", []byte(placeholderText))
		if err != nil {
			rv.Close()
			return nil, err
		}
		defer ph.Close()
		files = []*os.File{ph, ph, ph}
	} else {
		var err error
		if host, theirs, err = shm.SocketPair(); err != nil {
			return nil, err
		}
		// The socket on FDRegion, and on FDDone and FDSteal as placeholders: the Go runtime
		// opens files of its own at the lowest free numbers before main, and the spare must
		// later put its region, eventfd and ring on those three (awaitAssignment).
		files = []*os.File{theirs, theirs, theirs}
	}
	fail := func(err error) (*Spare, error) {
		if host != nil {
			host.Close()
		}
		if rv != nil {
			rv.Close()
		}
		return nil, err
	}
	cmd, err := lc.command(files, env)
	if err != nil {
		if theirs != nil {
			theirs.Close()
		}
		return fail(err)
	}
	c, err := lc.spawn(cmd, NewOutput(lc.Root, -1))
	if theirs != nil {
		theirs.Close() // the child's copy only: its death reads as end of file here
	}
	if err != nil {
		return fail(err)
	}
	sp := &Spare{child: c, sock: host}
	s.mu.Lock()
	if s.closed { // Close ran while it was being spawned: it would not kill this one
		s.mu.Unlock()
		if rv != nil {
			rv.Close()
		}
		sp.kill()
		return nil, errSparesClosed
	}
	if s.booting == nil {
		s.booting = map[*Spare]bool{}
	}
	s.booting[sp] = true
	s.mu.Unlock()
	unbook := func() {
		s.mu.Lock()
		delete(s.booting, sp)
		s.mu.Unlock()
	}
	deadline := time.Now().Add(lc.StartupTimeout)
	if rv != nil {
		// Accept ends when the spare connects, at the deadline, or when the spare dies
		// (Close kills it meanwhile if it must).
		accepted := make(chan struct{})
		go func() {
			select {
			case <-c.waited:
				rv.Close()
			case <-accepted:
			}
		}()
		rv.Refused = lc.refused(-1, c.pid)
		sp.sock, err = rv.Accept(deadline, peerCheck(c.pid))
		close(accepted)
		if err != nil {
			unbook()
			sp.kill()
			return nil, fmt.Errorf("spare did not connect: %w", err)
		}
	}
	// It is a spare once it has initialised: its one-byte message says so. Close kills it
	// meanwhile if it must; the read then fails.
	_ = sp.sock.SetReadDeadline(deadline)
	n, err := sp.sock.Read(make([]byte, 1))
	unbook()
	if n != 1 {
		sp.kill()
		return nil, fmt.Errorf("spare did not report ready: %v", err)
	}
	return sp, nil
}

// errSparesClosed is a spare spawned while the pool closed.
var errSparesClosed = errors.New("the pool is closing")

// shrinkSparesAfter is how long an adaptive stock above Count waits without a miss before
// it keeps one spare fewer.
const shrinkSparesAfter = time.Minute

// assign turns the spare into a lane: one message with the descriptors (Launcher.Assign:
// the boot record's first). Its one byte of data is the count, as a rendezvous sends it; an
// empty message would read as end of file. The socket is closed either way.
func (sp *Spare) assign(files []*os.File) error {
	defer sp.sock.Close()
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return shm.SendFiles(sp.sock, time.Time{}, []byte{byte(len(fds))}, fds...)
}

// kill ends a spare that was never assigned, and reaps it.
func (sp *Spare) kill() {
	_ = pgroup.Signal(sp.pid, syscall.SIGKILL)
	<-sp.waited
	sp.dropCgroup(zap.NewNop()) // one that cannot be removed now is removed again by Close
	if sp.sock != nil {
		sp.sock.Close()
	}
}
