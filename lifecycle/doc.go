// Package lifecycle holds lane states, the boot handshake (with the sandbox a lane applies to
// itself before it serves), the stop protocol and exit classification into coded errors. It must never touch slot words directly: the fast path
// belongs to fastpath.
package lifecycle
