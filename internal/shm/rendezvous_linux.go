//go:build linux

package shm

import (
	"bufio"
	"crypto/rand"
	"crypto/subtle"
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
	keySize    = 32 // bytes of a rendezvous's secret
)

// A Rendezvous hands descriptors to one process that cannot inherit them (a wrapper between
// the host and the lane closes inherited descriptors): a unix socket (SOCK_SEQPACKET) bound
// at /dev/shm/knit-<pid>-<16 random hex digits>, mode 0600. The host accepts connections
// until one peer proves it is the process the rendezvous is for, sends the descriptors to
// that one as SCM_RIGHTS in one message and removes the name. The pid in the name is the
// creator's, so that Sweep can remove the names of a host that died before removing them
// itself.
//
// A peer proves it twice. The kernel says who it is (SO_PEERCRED), which the caller's allow
// function judges; a peer whose pid this process cannot see (it reads 0: the peer is in a
// pid namespace outside this one's) is refused before that. And the peer's first message
// must be the rendezvous's secret (Key: 32 random bytes), which the host gives only the
// process it starts, in its environment: a process of the same user in another pid
// namespace, which cannot see the lane, cannot read it from /proc either. A refused peer
// gets nothing, its connection is closed, Refused hears why, and the host waits on for the
// right one until its deadline.
//
// The shared memory itself never has a name: it stays a sealed memfd (CreateMemfd), which the
// peer can map and write but not resize. A regular file under /dev/shm cannot be sealed.
type Rendezvous struct {
	name string
	key  [keySize]byte
	ln   *net.UnixListener
	once sync.Once

	// Refused, when set before Accept or Hand, is told about each peer that was refused,
	// with why (the host logs it).
	Refused func(Peer, error)
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
	r := &Rendezvous{name: name, ln: ln}
	if _, err := rand.Read(r.key[:]); err != nil {
		ln.Close()
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	return r, nil
}

// Name is the rendezvous's entry under Dir, for Collect.
func (r *Rendezvous) Name() string { return r.name }

// Key is the rendezvous's secret, in hex, for Collect or Dial: the caller passes it only to
// the process the rendezvous is for.
func (r *Rendezvous) Key() string { return hex.EncodeToString(r.key[:]) }

// Accept accepts connections until one, before deadline, is from a peer allow admits and
// proves itself with the key, and closes the rendezvous, removing its name, whatever happens.
// Each refused peer is closed unanswered (and told to Refused). It returns the admitted
// connection as a file in non-blocking mode, so that reads and writes on it go through Go's
// netpoller and honour deadlines. It fails if no peer is admitted in time, or if Close is
// called meanwhile.
//
// A peer that allow admits but that does not send the key holds the others up until
// deadline: allow admits only the process the rendezvous is for and its descendants, which
// can delay only their own start.
func (r *Rendezvous) Accept(deadline time.Time, allow func(Peer) error) (*os.File, error) {
	defer r.Close()
	_ = r.ln.SetDeadline(deadline)
	refused := 0
	for {
		conn, err := r.ln.AcceptUnix()
		if err != nil {
			if refused > 0 {
				return nil, fmt.Errorf("knit/shm: rendezvous: no peer admitted (%d refused): %w", refused, err)
			}
			return nil, fmt.Errorf("knit/shm: rendezvous: nobody connected: %w", err)
		}
		f, peer, err := r.admit(conn, deadline, allow)
		conn.Close()
		if err == nil {
			r.Close() // the name goes as soon as the lane has its connection
			return f, nil
		}
		refused++
		if r.Refused != nil {
			r.Refused(peer, err)
		}
	}
}

// admit checks one connection: the peer's credentials, then its key. It returns the
// connection as a non-blocking file of its own.
func (r *Rendezvous) admit(conn *net.UnixConn, deadline time.Time, allow func(Peer) error) (*os.File, Peer, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, Peer{}, err
	}
	var cred *unix.Ucred
	if cerr := rc.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, Peer{}, fmt.Errorf("SO_PEERCRED: %w", err)
	}
	peer := Peer{PID: int(cred.Pid), UID: int(cred.Uid)}
	if peer.PID == 0 {
		return nil, peer, errors.New("the peer's pid is not visible here: it runs in a pid namespace outside this process's")
	}
	if err := allow(peer); err != nil {
		return nil, peer, err
	}
	_ = conn.SetReadDeadline(deadline)
	var got [keySize + 1]byte // a longer message is a wrong one
	n, err := conn.Read(got[:])
	if err != nil {
		return nil, peer, fmt.Errorf("reading its key: %w", err)
	}
	if subtle.ConstantTimeCompare(got[:n], r.key[:]) != 1 {
		return nil, peer, errors.New("wrong key")
	}
	_ = conn.SetReadDeadline(time.Time{})
	f, err := conn.File() // a duplicate, in blocking mode
	if err != nil {
		return nil, peer, err
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err == nil {
		unix.CloseOnExec(fd)
		if err = unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		return nil, peer, err
	}
	return os.NewFile(uintptr(fd), r.name), peer, nil // non-blocking: os.NewFile registers it with the netpoller
}

// Hand waits for the peer the rendezvous is for (Accept), sends files to it as SCM_RIGHTS in
// one message and closes the connection.
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

// Dial connects to the rendezvous name (an entry under Dir) and proves itself with key (the
// rendezvous's Key). It returns the connection as a file in blocking mode, for a process
// that uses it with plain system calls.
func Dial(name, key string) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	k, err := hex.DecodeString(key)
	if err != nil || len(k) != keySize {
		return nil, fmt.Errorf("knit/shm: rendezvous: invalid key (%d hex digits, want %d)", len(key), 2*keySize)
	}
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: Dir + "/" + name, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write(k); err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: sending the key: %w", err)
	}
	f, err := conn.File()
	if err != nil {
		return nil, fmt.Errorf("knit/shm: rendezvous: %w", err)
	}
	return f, nil
}

// Collect connects to the rendezvous name with its key (Dial) and receives the n
// descriptors its creator hands over (Hand).
func Collect(name, key string, n int) ([]*os.File, error) {
	if n < 1 || n > maxFiles {
		return nil, fmt.Errorf("knit/shm: rendezvous: cannot collect %d files", n)
	}
	return collect(name, key, n, n)
}

// CollectUpTo is Collect for a receiver that learns how many descriptors there are from
// what they hold: it receives from 1 to max of them.
func CollectUpTo(name, key string, max int) ([]*os.File, error) {
	if max < 1 || max > maxFiles {
		return nil, fmt.Errorf("knit/shm: rendezvous: cannot collect up to %d files", max)
	}
	return collect(name, key, 1, max)
}

func collect(name, key string, least, most int) ([]*os.File, error) {
	conn, err := Dial(name, key)
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
// this user whose pid names no living process and on which no socket listens. A host
// removes its names itself; one that is killed while a lane boots (SIGKILL, OOM) cannot,
// and its names would stay until reboot. Sweep reports the names it removed. A pid reused
// by an unrelated process keeps its dead host's names until that process ends too.
//
// The listening check is for hosts in other pid namespaces sharing Dir (containers): their
// pids mean nothing here, but their listening sockets show in /proc/net/unix when they
// share this network namespace. A living host in another pid and network namespace is
// not seen: its lane, starting then, fails its start (it finds no rendezvous) and is
// restarted.
func Sweep() ([]string, error) {
	entries, err := os.ReadDir(Dir)
	if err != nil {
		return nil, fmt.Errorf("knit/shm: sweep: %w", err)
	}
	uid := os.Geteuid()
	var removed []string
	var errs []error
	var listening map[string]bool // read once, if some name's pid is not alive
	for _, e := range entries {
		pid, ok := namePID(e.Name())
		if !ok || pid == os.Getpid() || alive(pid) {
			continue
		}
		if listening == nil {
			listening = listeningSockets()
		}
		if listening[Dir+"/"+e.Name()] {
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

// listeningSockets lists the paths of the unix sockets that listen in this network
// namespace (/proc/net/unix: flag __SO_ACCEPTCON, 0x10000). It returns an empty map if it
// cannot tell.
func listeningSockets() map[string]bool {
	out := map[string]bool{}
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 {
			continue
		}
		flags, err := strconv.ParseUint(fields[3], 16, 32)
		if err == nil && flags&0x10000 != 0 {
			out[fields[7]] = true
		}
	}
	return out
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
