// Package lifecycle holds a lane's life outside the fast path: one incarnation's start, ready
// wait, stop protocol, end and closure (Lane); the runtimes incarnations run on (Runtime and
// Incarnation: Goroutines and Processes, behind which the pool never asks which one it has);
// both halves of the process boot protocol (the lane's Serve, with the sandbox and limits it
// applies to itself before it serves; the host's Launcher, Process and Spares, which start,
// hand over to, kill and wait for lane processes, and the Output relay of what they print);
// the stop protocol's escalation; and exit classification into coded errors.
//
// It must never touch slot words directly: the fast path belongs to fastpath. It never sees
// a pool: what it needs from one (the lane command, loggers, cgroups, metrics hooks) is
// given in Launcher, Processes and LaneConfig fields, and a Lane drives the host end of its
// rings through the four methods of Rings.
package lifecycle
