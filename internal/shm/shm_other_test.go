//go:build !linux

package shm

import (
	"errors"
	"testing"
)

func TestUnsupported(t *testing.T) {
	if _, err := CreateMemfd("knit", 4096); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("CreateMemfd: %v", err)
	}
	if _, err := Listen(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Listen: %v", err)
	}
}
