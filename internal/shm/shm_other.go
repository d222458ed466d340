//go:build !linux

package shm

import "os"

// CreateMemfd is not supported on this platform: it returns ErrUnsupported.
func CreateMemfd(name string, size int) (*Mapping, error) { return nil, ErrUnsupported }

// CreateNamed is not supported on this platform: it returns ErrUnsupported.
func CreateNamed(size int) (*Mapping, error) { return nil, ErrUnsupported }

// OpenNamed is not supported on this platform: it returns ErrUnsupported.
func OpenNamed(name string) (*Mapping, error) { return nil, ErrUnsupported }

// MapFile is not supported on this platform: it closes f and returns ErrUnsupported.
func MapFile(f *os.File) (*Mapping, error) {
	if f != nil {
		f.Close()
	}
	return nil, ErrUnsupported
}

// Unlink returns ErrUnsupported.
func (m *Mapping) Unlink() error { return ErrUnsupported }

// Close returns ErrUnsupported.
func (m *Mapping) Close() error { return ErrUnsupported }
