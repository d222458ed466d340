//go:build linux

package main

// ============================================================================
// knit rows — REGISTER KNIT'S OWN SCENARIOS HERE.
// ============================================================================
//
// knitScenarios is the only place knit's rows are added; allScenarios
// appends them after the peer baselines, so they share the run, the
// reference row and the table with them. knit's API is not ready yet, so it
// returns nil for now.
//
// When the API lands, import github.com/knitgo/knit packages here and run
// `go mod tidy` in bench/: go.mod already replaces github.com/knitgo/knit
// with ../ (this checkout), and tidy then adds the matching
// `require github.com/knitgo/knit v0.0.0-00010101000000-000000000000`
// line (an unused require would be dropped by tidy, so none is there yet).
// Return rows shaped like the baselines they are meant to beat, e.g.
//
//	{name: "knit goroutine lane: round trip", inFlight: 1, setup: ...},
//	{name: "knit goroutine lane: 1024 in flight", inFlight: inFlightTarget, setup: ...},
//	{name: "knit process lane: round trip", inFlight: 1, setup: ...},
//	{name: "knit process lane: 1024 in flight", inFlight: inFlightTarget, setup: ...},
//
// setup runs outside the timed region and must return a cleanup that stops
// every lane and reaps every child process; use runInFlight for throughput
// rows and fail(b, err) to report errors. A process lane that re-executes
// this binary adds its role to runChildIfRequested in child.go. Compare:
// goroutine lanes with the chan/ants/pond/protoactor rows, process lanes
// with "shm spin child: round trip" (the floor) and "shm futex child: round
// trip" (the cost of a kernel sleep/wake per message).
func knitScenarios() []scenario { return nil }
