//go:build linux

package shm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const (
	shmDir      = "/dev/shm"
	namePrefix  = "knit-"
	createTries = 8
)

// CreateMemfd creates an anonymous memory file (memfd_create with MFD_CLOEXEC) of size bytes
// and maps it. name only labels the file in /proc/<pid>/fd.
func CreateMemfd(name string, size int) (*Mapping, error) {
	if err := checkSize(int64(size)); err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("knit/shm: memfd_create: %w", err)
	}
	data, err := truncateAndMap(fd, size)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Mapping{data: data, file: os.NewFile(uintptr(fd), "memfd:"+name)}, nil
}

// CreateNamed creates /dev/shm/knit-<pid>-<16 random hex digits> (mode 0600, O_EXCL) of
// size bytes and maps it; the creator's pid in the name tells whose an entry is. The entry is removed by Unlink or Close, whichever comes first.
func CreateNamed(size int) (*Mapping, error) {
	if err := checkSize(int64(size)); err != nil {
		return nil, err
	}
	var (
		name, path string
		fd         int
		err        error
	)
	for range createTries {
		var r [8]byte
		rand.Read(r[:])
		name = namePrefix + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(r[:])
		path = shmDir + "/" + name
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("knit/shm: create %s: %w", path, err)
	}
	fail := func(err error) (*Mapping, error) {
		unix.Close(fd)
		unix.Unlink(path)
		return nil, err
	}
	// The umask may have narrowed the mode; make it exactly 0600.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return fail(fmt.Errorf("knit/shm: fchmod %s: %w", path, err))
	}
	data, err := truncateAndMap(fd, size)
	if err != nil {
		return fail(err)
	}
	return &Mapping{data: data, file: os.NewFile(uintptr(fd), path), name: name, unlinkOnClose: true}, nil
}

// OpenNamed maps the existing entry /dev/shm/<name>, at its current size. name must start
// with "knit-" and contain neither '/' nor "..". Close does not remove the entry; Unlink does.
func OpenNamed(name string) (*Mapping, error) {
	if !strings.HasPrefix(name, namePrefix) || len(name) == len(namePrefix) ||
		strings.ContainsAny(name, "/\x00") || strings.Contains(name, "..") {
		return nil, fmt.Errorf("knit/shm: invalid mapping name %q", name)
	}
	path := shmDir + "/" + name
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("knit/shm: open %s: %w", path, err)
	}
	data, err := statAndMap(fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Mapping{data: data, file: os.NewFile(uintptr(fd), path), name: name}, nil
}

// MapFile maps f, typically a descriptor inherited from a parent process, at its current size.
// It takes ownership of f: Close closes it, and f is closed if MapFile fails.
func MapFile(f *os.File) (*Mapping, error) {
	if f == nil {
		return nil, errors.New("knit/shm: MapFile: nil file")
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("knit/shm: MapFile: %w", err)
	}
	var data []byte
	if cerr := rc.Control(func(fd uintptr) { data, err = statAndMap(int(fd)) }); cerr != nil {
		err = fmt.Errorf("knit/shm: MapFile: %w", cerr)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Mapping{data: data, file: f}, nil
}

// Unlink removes the /dev/shm entry of a named mapping now; the mapping itself stays usable.
// It is idempotent, and a no-op for memfd and MapFile mappings.
func (m *Mapping) Unlink() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unlinkLocked()
}

func (m *Mapping) unlinkLocked() error {
	if m.name == "" || m.unlinked {
		return nil
	}
	m.unlinked = true
	if err := unix.Unlink(shmDir + "/" + m.name); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("knit/shm: unlink %s: %w", m.name, err)
	}
	return nil
}

// Close unmaps the memory, closes the file and, for a named mapping made by CreateNamed that
// is still linked, removes its /dev/shm entry. It is idempotent.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	var errs []error
	if m.data != nil {
		if err := unix.Munmap(m.data); err != nil {
			errs = append(errs, fmt.Errorf("knit/shm: munmap: %w", err))
		}
		m.data = nil
	}
	if m.file != nil {
		if err := m.file.Close(); err != nil {
			errs = append(errs, fmt.Errorf("knit/shm: close: %w", err))
		}
		m.file = nil
	}
	if m.unlinkOnClose {
		errs = append(errs, m.unlinkLocked())
	}
	return errors.Join(errs...)
}

func truncateAndMap(fd, size int) ([]byte, error) {
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, fmt.Errorf("knit/shm: ftruncate: %w", err)
	}
	return mmap(fd, size)
}

func statAndMap(fd int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("knit/shm: fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("knit/shm: not a regular file (mode %#o)", st.Mode)
	}
	if err := checkSize(st.Size); err != nil {
		return nil, err
	}
	return mmap(fd, int(st.Size))
}

func mmap(fd, size int) ([]byte, error) {
	data, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("knit/shm: mmap: %w", err)
	}
	return data, nil
}
