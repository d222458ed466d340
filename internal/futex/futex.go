// Package futex wraps the Linux futex and eventfd calls that knit's doorbells park and wake on.
// Operations are non-private so they work across processes sharing a mapping. It must never
// decide policy (spinning, timeouts): callers do.
package futex

import "errors"

// ErrTimedOut is returned by Wait and EventFD.Wait when the timeout expires.
var ErrTimedOut = errors.New("knit/futex: timed out")

// ErrUnsupported is returned by every function on platforms other than Linux.
var ErrUnsupported = errors.New("knit: shared memory requires Linux")
