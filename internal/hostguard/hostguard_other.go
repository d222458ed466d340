//go:build !linux

package hostguard

// Snapshot is empty where there are no rlimits to guard.
type Snapshot struct{}

// Take returns ErrUnsupported.
func Take() (*Snapshot, error) { return nil, ErrUnsupported }

// Restore finds nothing.
func (s *Snapshot) Restore() []Change { return nil }
