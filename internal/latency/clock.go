package latency

import (
	"time"
	_ "unsafe" // for go:linkname
)

// Now reads the monotonic clock: one vDSO call, where time.Now makes two (wall and
// monotonic). Calls are timed twice each, so this halves what timing them costs. Only
// differences between readings mean anything.
func Now() time.Duration { return time.Duration(nanotime()) }

// nanotime is the runtime's monotonic clock, which the runtime keeps reachable by linkname
// for packages outside the standard library (go.dev/issue/67401).
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64
