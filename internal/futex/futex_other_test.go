//go:build !linux

package futex

import (
	"errors"
	"sync/atomic"
	"testing"
)

func TestUnsupported(t *testing.T) {
	var w atomic.Uint32
	if err := Wait(&w, 0, 0); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Wait: %v", err)
	}
	if _, err := NewEventFD(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("NewEventFD: %v", err)
	}
}
