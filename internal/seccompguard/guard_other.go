//go:build !linux

package seccompguard

// DenyForeignArch returns ErrUnsupported.
func DenyForeignArch(native uint32) error { return ErrUnsupported }

// OthersSupported reports false: seccomp is Linux's.
func OthersSupported() bool { return false }

// DenyOthers returns ErrUnsupported.
func DenyOthers(self int) error { return ErrUnsupported }
