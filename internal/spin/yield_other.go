//go:build !linux

package spin

import "runtime"

// Yield gives the processor to another goroutine; without sched_yield it cannot do more.
func Yield() { runtime.Gosched() }
