// Package lifecycle holds lane states, the boot handshake, the stop protocol and exit
// classification into coded errors. It must never touch slot words directly: the fast path
// belongs to fastpath.
package lifecycle
