//go:build !linux

package privs

// NoNewPrivs returns ErrUnsupported.
func NoNewPrivs() error { return ErrUnsupported }

// DropCapabilities returns ErrUnsupported.
func DropCapabilities() error { return ErrUnsupported }

// Undumpable returns ErrUnsupported.
func Undumpable() error { return ErrUnsupported }

// Dumpable returns ErrUnsupported.
func Dumpable() (int, error) { return 0, ErrUnsupported }

// Threads returns ErrUnsupported.
func Threads() ([]Thread, error) { return nil, ErrUnsupported }
