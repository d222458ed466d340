//go:build !linux

package seccompguard

// DenyForeignArch returns ErrUnsupported.
func DenyForeignArch(native uint32) error { return ErrUnsupported }
