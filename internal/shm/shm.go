// Package shm maps shared memory for knit's fast path: sealed memfd mappings, the named
// rendezvous that hands them to a process that cannot inherit descriptors, the sweep of
// names a dead host left behind, plus typed atomic views of mapped words.
//
// It must never interpret the bytes it maps, and never hand another process a file that
// process could resize under a mapping of this one (a Go program does not survive the
// SIGBUS that follows).
package shm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
)

// ErrUnsupported is returned by every mapping function on platforms other than Linux.
var ErrUnsupported = errors.New("knit: shared memory requires Linux")

// maxSize bounds every mapping: 4 GiB.
const maxSize = 1 << 32

// Mapping is a MAP_SHARED|PROT_READ|PROT_WRITE mapping of a file.
// Its methods are safe for concurrent use; the bytes themselves are the caller's business.
type Mapping struct {
	mu     sync.Mutex
	data   []byte
	file   *os.File
	closed bool
}

// Bytes returns the mapped memory, or nil after Close. Using it after Close faults.
func (m *Mapping) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.data
}

// File returns the backing file, for instance to pass to a child process through
// exec.Cmd.ExtraFiles. It returns nil after Close.
func (m *Mapping) File() *os.File {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.file
}

func checkSize(size int64) error {
	limit := int64(maxSize)
	if math.MaxInt < limit {
		limit = math.MaxInt // 32-bit platforms
	}
	if size <= 0 || size > limit {
		return fmt.Errorf("knit/shm: size %d out of range (1..%d)", size, limit)
	}
	return nil
}
