//go:build linux

package shm

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// sealedAll is what SealedFile seals a file with: nothing about it can change any more.
const sealedAll = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE | unix.F_SEAL_SEAL

// SealedFile returns an anonymous memory file (memfd, close-on-exec) holding data and sealed
// against every change, to pass to another process as an inherited or SCM_RIGHTS descriptor:
// a message of any size that needs no reader while it is written (a pipe fills at 64 KiB)
// and that the receiver reads at its own pace, as often as it likes. name only labels the
// file in /proc/<pid>/fd.
func SealedFile(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("knit/shm: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("knit/shm: writing a sealed file: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, sealedAll); err != nil {
		f.Close()
		return nil, fmt.Errorf("knit/shm: sealing a file: %w", err)
	}
	return f, nil
}

// ReadSealed reads the whole of f, a file from another process (SealedFile), from its start,
// refusing one that is not a regular file of at most max bytes, or that is not sealed
// against writes and resizing: its size is then what it will read, and the bytes cannot
// change while it reads them. It reads at most max bytes whatever the file claims, and does
// not close f.
func ReadSealed(f *os.File, max int64) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("knit/shm: fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("knit/shm: not a regular file (mode %#o)", st.Mode)
	}
	if st.Size < 0 || st.Size > max {
		return nil, fmt.Errorf("knit/shm: a file of %d bytes, at most %d expected", st.Size, max)
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err == unix.EINVAL { // a file that cannot have seals (not a memfd)
		seals, err = 0, nil
	}
	if err != nil {
		return nil, fmt.Errorf("knit/shm: reading a file's seals: %w", err)
	}
	if need := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE; seals&need != need {
		return nil, fmt.Errorf("knit/shm: a file not sealed against changes (seals %#x)", seals)
	}
	b := make([]byte, st.Size)
	if _, err := f.ReadAt(b, 0); err != nil && (err != io.EOF || len(b) != 0) {
		return nil, fmt.Errorf("knit/shm: reading a sealed file: %w", err)
	}
	return b, nil
}

// IsSealedWith reports whether descriptor fd, which the caller may not own, is a file sealed
// against every change whose whole content is content: a marker the caller's parent left
// there. It only reads: fd is not closed, and no *os.File is made of it (whose finalizer
// would close it).
func IsSealedWith(fd int, content []byte) bool {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(len(content)) {
		return false
	}
	if seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0); err != nil || seals&sealedAll != sealedAll {
		return false
	}
	b := make([]byte, len(content)+1)
	n, err := unix.Pread(fd, b, 0)
	return err == nil && n == len(content) && string(b[:n]) == string(content)
}
