//go:build !linux

package futex

import (
	"os"
	"sync/atomic"
	"time"
)

// Wait returns ErrUnsupported.
func Wait(addr *atomic.Uint32, val uint32, timeout time.Duration) error { return ErrUnsupported }

// Wake returns ErrUnsupported.
func Wake(addr *atomic.Uint32, n int) (int, error) { return 0, ErrUnsupported }

// EventFD is unsupported on this platform: every method returns ErrUnsupported.
type EventFD struct{ f *os.File }

// NewEventFD returns ErrUnsupported.
func NewEventFD() (*EventFD, error) { return nil, ErrUnsupported }

// EventFDFromFile wraps f; every method of the result returns ErrUnsupported.
func EventFDFromFile(f *os.File) *EventFD { return &EventFD{f: f} }

// File returns the wrapped file.
func (e *EventFD) File() *os.File { return e.f }

// Signal returns ErrUnsupported.
func (e *EventFD) Signal() error { return ErrUnsupported }

// Wait returns ErrUnsupported.
func (e *EventFD) Wait(timeout time.Duration) (uint64, error) { return 0, ErrUnsupported }

// Close closes the wrapped file, if any, and returns ErrUnsupported.
func (e *EventFD) Close() error {
	if e.f != nil {
		e.f.Close()
	}
	return ErrUnsupported
}
