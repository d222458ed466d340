//go:build linux

package shm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// Dir is where rendezvous names live.
	Dir        = "/dev/shm"
	namePrefix = "knit-"
	maxFiles   = 8
)

// A Rendezvous hands descriptors to one process that cannot inherit them (a wrapper between
// the host and the lane closes inherited descriptors): a unix socket (SOCK_SEQPACKET) bound
// at /dev/shm/knit-<pid>-<16 random hex digits>, mode 0600, on which the host accepts
// exactly one connection, checks who connected, sends the descriptors as SCM_RIGHTS in one
// message and removes the name. The pid in the name is the creator's, so that Sweep can
// remove the names of a host that died before removing them itself.
//
// The shared memory itself never has a name: it stays a sealed memfd (CreateMemfd), which the
// peer can map and write but not resize. A regular file under /dev/shm cannot be sealed.
type Rendezvous struct {
	name string
	ln   *net.UnixListener
	once sync.Once
}

// Peer is who connected to a rendezvous, as the kernel reports it (SO_PEERCRED), translated
// into this process's namespaces: PID is 0 when the peer's pid namespace is not visible here.
type Peer struct {
	PID int
	UID int
}

// Listen creates a rendezvous.
func Listen() (*Rendezvous, error) {
	var (
		ln   *net.UnixListener
		name string
		err  error
	)
	for range 8 {
		var r [8]byte
		_, _ = rand.Read(r[:])
		name = namePrefix + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(r[:])
		ln, err = net.ListenUnix("unixpacket", &net.UnixAddr{Name: Dir + "/" + name, Net: "unixpacket"})
		if !errors.Is(err, unix.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	// bind(2) applied the umask; the mode must be exactly 0600. A connection that slipped in
	// before the chmod is still checked by the caller's allow function.
	if err := os.Chmod(Dir+"/"+name, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	return &Rendezvous{name: name, ln: ln}, nil
}

// Name is the rendezvous's entry under Dir, for Collect.
func (r *Rendezvous) Name() string { return r.name }

// Accept accepts one connection before deadline, asks allow whether its peer may have it,
// and closes the rendezvous, removing its name, whatever happens. It returns the connection
// as a file in non-blocking mode, so that reads and writes on it go through Go's netpoller
// and honour deadlines. It fails if no peer connects in time, if allow refuses the peer, or
// if Close is called meanwhile.
func (r *Rendezvous) Accept(deadline time.Time, allow func(Peer) error) (*os.File, error) {
	defer r.Close()
	_ = r.ln.SetDeadline(deadline)
	conn, err := r.ln.AcceptUnix()
	r.Close() // exactly one connection
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: nobody connected: %w", err)
	}
	defer conn.Close()
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	var cred *unix.Ucred
	if cerr := rc.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: SO_PEERCRED: %w", err)
	}
	if err := allow(Peer{PID: int(cred.Pid), UID: int(cred.Uid)}); err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: peer refused: %w", err)
	}
	f, err := conn.File() // a duplicate, in blocking mode
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err == nil {
		unix.CloseOnExec(fd)
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	return os.NewFile(uintptr(fd), r.name), nil // non-blocking: os.NewFile registers it with the netpoller
}

// Hand accepts one connection (Accept), sends files to it as SCM_RIGHTS in one message and
// closes it.
func (r *Rendezvous) Hand(deadline time.Time, allow func(Peer) error, files ...*os.File) error {
	if len(files) == 0 || len(files) > maxFiles {
		r.Close()
		return fmt.Errorf("knit/shm: rendezvous: %d files to hand over", len(files))
	}
	conn, err := r.Accept(deadline, allow)
	if err != nil {
		return err
	}
	defer conn.Close()
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	if err := SendFiles(conn, deadline, []byte{byte(len(fds))}, fds...); err != nil {
		return fmt.Errorf("knit/shm: rendezvous: sending descriptors: %w", err)
	}
	return nil
}

// SendFiles sends msg with fds as SCM_RIGHTS in one message on conn, a non-blocking unix
// socket, waiting until deadline (zero: no limit) for room.
func SendFiles(conn *os.File, deadline time.Time, msg []byte, fds ...int) error {
	_ = conn.SetWriteDeadline(deadline)
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	oob := unix.UnixRights(fds...)
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), msg, oob, nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}

// Close removes the rendezvous's name and ends a Hand waiting for a connection. It is
// idempotent.
func (r *Rendezvous) Close() error {
	var err error
	r.once.Do(func() { err = r.ln.Close() }) // a listener made by ListenUnix unlinks its path
	return err
}

// Dial connects to the rendezvous name (an entry under Dir). It returns the connection as a
// file in blocking mode, for a process that uses it with plain system calls.
func Dial(name string) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: Dir + "/" + name, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	defer conn.Close()
	f, err := conn.File()
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	return f, nil
}

// Collect connects to the rendezvous name and receives the n descriptors its creator hands
// over (Hand).
func Collect(name string, n int) ([]*os.File, error) {
	if n < 1 || n > maxFiles {
		return nil, fmt.Errorf("knit/shm: rendezvous: cannot collect %d files", n)
	}
	return collect(name, n, n)
}

// CollectUpTo is Collect for a receiver that learns how many descriptors there are from
// what they hold: it receives from 1 to max of them.
func CollectUpTo(name string, max int) ([]*os.File, error) {
	if max < 1 || max > maxFiles {
		return nil, fmt.Errorf("knit/shm: rendezvous: cannot collect up to %d files", max)
	}
	return collect(name, 1, max)
}

func collect(name string, least, most int) ([]*os.File, error) {
	conn, err := Dial(name)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(maxFiles*4))
	var oobn int
	for {
		_, oobn, _, _, err = unix.Recvmsg(int(conn.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err == nil {
		for i := range msgs {
			got, perr := unix.ParseUnixRights(&msgs[i])
			if perr != nil {
				err = perr
			}
			fds = append(fds, got...)
		}
	}
	switch {
	case err != nil:
	case least == most && len(fds) != least:
		err = fmt.Errorf("%d descriptors, want %d", len(fds), least)
	case len(fds) < least || len(fds) > most:
		err = fmt.Errorf("%d descriptors, want %d to %d", len(fds), least, most)
	}
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("knit/shm: rendezvous: %w (the host refused this process, or is gone)", err)
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), name)
	}
	return files, nil
}

func checkName(name string) error {
	if !strings.HasPrefix(name, namePrefix) || len(name) == len(namePrefix) ||
		strings.ContainsAny(name, "/\x00") || strings.Contains(name, "..") {
		return fmt.Errorf("knit/shm: invalid rendezvous name %q", name)
	}
	return nil
}

// Sweep removes what dead knit hosts left under Dir: every entry knit-<pid>-… owned by
// this user whose pid names no living process. A host removes its names itself; one that is
// killed while a lane boots (SIGKILL, OOM) cannot, and its names would stay until reboot.
// Sweep reports the names it removed. A pid reused by an unrelated process keeps its dead
// host's names until that process ends too.
func Sweep() ([]string, error) {
	entries, err := os.ReadDir(Dir)
	if err != nil {
		return nil, fmt.Errorf("knit/shm: sweep: %w", err)
	}
	uid := os.Geteuid()
	var removed []string
	var errs []error
	for _, e := range entries {
		pid, ok := namePID(e.Name())
		if !ok || pid == os.Getpid() || alive(pid) {
			continue
		}
		var st unix.Stat_t
		path := Dir + "/" + e.Name()
		if unix.Lstat(path, &st) != nil || int(st.Uid) != uid {
			continue
		}
		if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("knit/shm: sweep: %w", err))
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// namePID reads the pid out of a name knit-<pid>-<rest>.
func namePID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, namePrefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	return pid, err == nil && pid > 0
}

// alive reports whether pid names a process (EPERM: it exists, owned by someone else).
func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// SocketPair makes a connected pair of unix sockets (SOCK_SEQPACKET, close-on-exec) for a
// host and one process it starts: the host's end is non-blocking, so that its deadlines
// work; the other end is blocking, for a process that uses it with plain system calls.
func SocketPair() (host, peer *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	_ = unix.SetNonblock(fds[0], true) // the host's end goes through the netpoller: deadlines work
	return os.NewFile(uintptr(fds[0]), "knit-spare"), os.NewFile(uintptr(fds[1]), "knit-spare-lane"), nil
}
