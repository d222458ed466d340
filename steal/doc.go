// Package steal is knit's shared submit ring: one producer (the host) publishes calls into
// one 32-slot ring that up to 31 consumers (lanes) claim from in batches, each answering on
// its own fastpath return ring. Two claim disciplines sit behind one small interface:
// Ticket (a 64-bit claim head advanced by CAS, a publication tail stored once per burst, an
// order ring) and Dekker (regions of width g, one WANT word per consumer, seniors first).
//
// Every consumer keeps a claim journal in the mapping — which calls it claimed, started
// and finished — so that after its death the host's Recover returns exactly the calls it
// held, split into never started (safe to dispatch again) and started, and releases any
// claim handshake it was in the middle of, while the other consumers go on.
//
// The claim, journal and recovery code is written as step machines: one shared-memory
// access per step. The real Claim and Recover run the steps back to back; the model check
// in this package's tests runs the same step functions one at a time over every
// interleaving, with a consumer dying at every step (docs/stealing.md).
//
// The mapping is a []byte: heap memory for goroutine lanes, a MAP_SHARED mapping for
// process lanes. It holds no Go pointer. Everything a host reads from it was written by a
// consumer that may be broken or hostile: Recover validates every word and returns an
// error wrapping ErrCorrupt, never panics.
//
// steal builds on fastpath and internal packages only. It must never know about actors,
// lifecycles, supervision or what a call is: a call is a slot index and a sequence number.
package steal
