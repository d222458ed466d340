//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// seals is what CreateMemfd seals a memory file with: its size can never change again
// (F_SEAL_SHRINK, F_SEAL_GROW), and no seal can be added or removed (F_SEAL_SEAL).
const seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// CreateMemfd creates an anonymous memory file (memfd_create with MFD_CLOEXEC and
// MFD_ALLOW_SEALING) of size bytes, seals its size (seals) and maps it. name only labels the
// file in /proc/<pid>/fd.
//
// The seals are what make it safe to share: a process that holds the file — a lane, which
// may be hostile — cannot truncate it under the creator's mapping. Without them an ftruncate
// to 0 would make the creator's next access to the mapping fault with SIGBUS, which a Go
// program cannot survive. ftruncate on a sealed file fails with EPERM.
func CreateMemfd(name string, size int) (*Mapping, error) {
	if err := checkSize(int64(size)); err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("knit/shm: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("knit/shm: ftruncate: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("knit/shm: sealing the memfd: %w", err)
	}
	data, err := mmap(fd, size)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Mapping{data: data, file: os.NewFile(uintptr(fd), "memfd:"+name)}, nil
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

// Close unmaps the memory and closes the file. It is idempotent.
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
	return errors.Join(errs...)
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
