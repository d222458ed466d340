//go:build !linux

package shm

import (
	"os"
	"time"
)

// CreateMemfd is not supported on this platform: it returns ErrUnsupported.
func CreateMemfd(name string, size int) (*Mapping, error) { return nil, ErrUnsupported }

// MapFile is not supported on this platform: it closes f and returns ErrUnsupported.
func MapFile(f *os.File) (*Mapping, error) {
	if f != nil {
		f.Close()
	}
	return nil, ErrUnsupported
}

// Close returns ErrUnsupported.
func (m *Mapping) Close() error { return ErrUnsupported }

// Rendezvous is not supported on this platform.
type Rendezvous struct {
	Refused func(Peer, error)
}

// Peer is who connected to a rendezvous.
type Peer struct{ PID, UID int }

// Listen is not supported on this platform: it returns ErrUnsupported.
func Listen() (*Rendezvous, error) { return nil, ErrUnsupported }

// Name returns "".
func (r *Rendezvous) Name() string { return "" }

// Key returns "".
func (r *Rendezvous) Key() string { return "" }

// Accept returns ErrUnsupported.
func (r *Rendezvous) Accept(time.Time, func(Peer) error) (*os.File, error) {
	return nil, ErrUnsupported
}

// SendFiles returns ErrUnsupported.
func SendFiles(*os.File, time.Time, []byte, ...int) error { return ErrUnsupported }

// Dial returns ErrUnsupported.
func Dial(string, string) (*os.File, error) { return nil, ErrUnsupported }

// Hand returns ErrUnsupported.
func (r *Rendezvous) Hand(time.Time, func(Peer) error, ...*os.File) error { return ErrUnsupported }

// Close returns ErrUnsupported.
func (r *Rendezvous) Close() error { return ErrUnsupported }

// Collect is not supported on this platform: it returns ErrUnsupported.
func Collect(name, key string, n int) ([]*os.File, error) { return nil, ErrUnsupported }

// Sweep does nothing on this platform.
func Sweep() ([]string, error) { return nil, nil }

// SocketPair returns ErrUnsupported.
func SocketPair() (host, peer *os.File, err error) { return nil, nil, ErrUnsupported }

// SealedFile is not supported on this platform: it returns ErrUnsupported.
func SealedFile(string, []byte) (*os.File, error) { return nil, ErrUnsupported }

// ReadSealed is not supported on this platform: it returns ErrUnsupported.
func ReadSealed(*os.File, int64) ([]byte, error) { return nil, ErrUnsupported }

// CollectUpTo is not supported on this platform: it returns ErrUnsupported.
func CollectUpTo(string, int) ([]*os.File, error) { return nil, ErrUnsupported }

// IsSealedWith reports false on this platform.
func IsSealedWith(int, []byte) bool { return false }
