package knit

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/lifecycle"
)

// A spare is a lane process started ahead of need: it has exec'd, initialised the Go runtime
// and every package, reported so, and waits on a unix socket for a boot record. A restart
// that takes one skips the slowest part of a process lane's start (docs/benchmarks.md,
// "Supervision"). The socket is inherited on fd 3, or with SharedMemory Named, where a
// wrapper may close inherited descriptors, connected through a rendezvous (shm.Rendezvous).
type spare struct {
	*child
	sock *os.File // the host's end of the socket
}

// spares is a pool's stock of spare processes.
type spares struct {
	mu       sync.Mutex
	ready    []*spare
	starting int
	booting  map[*spare]bool // started, not yet initialised: Close kills them too
	closed   bool
	wg       sync.WaitGroup
}

// takeSpare hands a restart a living spare, if one is waiting. First starts never take one:
// they start together, and a spare is only started once the pool is up. (Lanes added by
// Resize, whose incarnation is 0 too, start once it is up.)
func (p *Pool) takeSpare(inc int) *spare {
	if inc == 0 && !p.up.Load() {
		return nil
	}
	s := &p.spares
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.ready) > 0 {
		sp := s.ready[0]
		s.ready = s.ready[1:]
		select {
		case <-sp.waited: // it died waiting
			sp.sock.Close()
			sp.dropCgroup(p.laneLog)
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

// refillSpares starts spares until Process.Spares are ready or starting.
func (p *Pool) refillSpares() {
	s := &p.spares
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.closed && len(s.ready)+s.starting < p.cfg.Process.Spares {
		s.starting++
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			sp, err := p.startSpare()
			s.mu.Lock()
			s.starting--
			switch {
			case err != nil && s.closed:
				// Close stopped it while it initialised: what Close is for, not a failure.
				s.mu.Unlock()
				p.log.Debug("spare lane process stopped by Close before it was ready", zap.Error(err))
			case err != nil:
				s.mu.Unlock()
				p.log.Warn("could not start a spare lane process", zap.Error(err))
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

// closeSpares ends every spare, and any still starting, before Close returns.
func (p *Pool) closeSpares() {
	s := &p.spares
	s.mu.Lock()
	s.closed = true
	ready := s.ready
	s.ready = nil
	for sp := range s.booting {
		_ = syscall.Kill(-sp.pid, syscall.SIGKILL)
	}
	s.mu.Unlock()
	for _, sp := range ready {
		sp.kill()
	}
	s.wg.Wait()
}

// sparePIDs lists the spare processes waiting for a restart.
func (p *Pool) sparePIDs() []int {
	s := &p.spares
	s.mu.Lock()
	defer s.mu.Unlock()
	var pids []int
	for _, sp := range s.ready {
		pids = append(pids, sp.pid)
	}
	return pids
}

func (p *Pool) startSpare() (*spare, error) {
	var (
		host, theirs *os.File
		rv           *shm.Rendezvous
		files        []*os.File
		env          = lifecycle.EnvSpare + "=1"
	)
	if p.cfg.Process.SharedMemory == Named {
		// A wrapper may close inherited descriptors: the spare connects to a rendezvous
		// for its socket instead of inheriting one.
		var err error
		if rv, err = shm.Listen(); err != nil {
			return nil, err
		}
		env = lifecycle.EnvSpare + "=" + rv.Name()
	} else {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("socketpair: %w", err)
		}
		_ = unix.SetNonblock(fds[0], true) // the host's end goes through the netpoller: deadlines work
		host, theirs = os.NewFile(uintptr(fds[0]), "knit-spare"), os.NewFile(uintptr(fds[1]), "knit-spare-lane")
		files = []*os.File{theirs}
	}
	fail := func(err error) (*spare, error) {
		if host != nil {
			host.Close()
		}
		if rv != nil {
			rv.Close()
		}
		return nil, err
	}
	cmd, err := p.laneCommand(files, env)
	if err != nil {
		if theirs != nil {
			theirs.Close()
		}
		return fail(err)
	}
	c, err := p.spawnChild(cmd, newLaneOutput(p.root, -1))
	if theirs != nil {
		theirs.Close() // the child's copy only: its death reads as end of file here
	}
	if err != nil {
		return fail(err)
	}
	sp := &spare{child: c, sock: host}
	s := &p.spares
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
		s.booting = map[*spare]bool{}
	}
	s.booting[sp] = true
	s.mu.Unlock()
	unbook := func() {
		s.mu.Lock()
		delete(s.booting, sp)
		s.mu.Unlock()
	}
	deadline := time.Now().Add(p.cfg.StartupTimeout)
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

// assign turns the spare into a lane: one message with the boot record and descriptors.
func (sp *spare) assign(record []byte, region, done *os.File, more ...*os.File) error {
	defer sp.sock.Close()
	msg, oob := lifecycle.Assignment(record, region, done, more...)
	conn, err := sp.sock.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := conn.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), msg, oob, nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}

// kill ends a spare that was never assigned, and reaps it.
func (sp *spare) kill() {
	_ = syscall.Kill(-sp.pid, syscall.SIGKILL)
	<-sp.waited
	sp.dropCgroup(zap.NewNop()) // one that cannot be removed now is removed again by Close
	if sp.sock != nil {
		sp.sock.Close()
	}
}
