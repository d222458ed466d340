//go:build !amd64

package spin

// Pause is a no-op where no spin-wait hint is wired up.
func Pause() {}
