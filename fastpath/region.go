// Package fastpath is knit's shared-memory transport: the region layout, the 32-slot rings
// that carry calls and results between a host and one lane, the producer-owned payload
// arenas, the abort bitmap, the stop word and the doorbells a parked side sleeps on.
//
// The same code runs over heap memory (goroutine lanes) and over a MAP_SHARED mapping
// (process lanes). Every byte read from a region may have been written by a broken or
// hostile process: readers validate and return errors, never panic and never index out of
// bounds. fastpath knows nothing about tasks, codecs, actors or lifecycles, and it never
// stores a Go pointer in a region.
package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/knitgo/knit/internal/shm"
)

// Magic opens every region ("KNIT" little-endian); Version is the protocol version.
const (
	Magic uint32 = 0x54494e4b
	// Version 2: the fatal-message area no longer overlaps the boot and part words; the
	// signal strip carries the heartbeat and running words; slot headers carry a sequence
	// number. Version 3: slot headers carry the call's deadline (Unix nanoseconds), and a
	// header holds up to 16 bytes of a value instead of 24. Version 4: the signal strip
	// carries the since word (Region.Since); the boot record travels in a sealed memfd, and
	// a named rendezvous wants its key. Version 5: the return ring's control sector carries
	// the direct completion doorbell's arm word (Ring.Direct) and the lane's mark that it
	// waits for room (Producer.WantRoom); the signal strip carries the gate word
	// (Region.Gate), with which the host takes back calls queued behind a long one.
	Version uint32 = 5
)

// Fixed protocol sizes.
const (
	Slots       = 32  // slots per ring: one bit each in a 32-bit word
	HeaderBytes = 64  // slot header: one cache line
	HeaderData  = 16  // bytes of a header that can carry a fixed-size value
	line        = 64  // cache line
	FatalBytes  = 832 // fatal-message area: the control block's last 13 lines
	ctrlBytes   = 1024

	// Limits a reader enforces on a layout it did not build.
	MaxInline    = 64 << 10
	MaxArena     = 1 << 30
	MaxAbortBits = 1 << 16
)

// Defaults for a zero Layout field.
const (
	DefaultInline    = 512
	DefaultArena     = 4 << 20
	DefaultAbortBits = 258
)

// Layout is the set of sizes that shape a region. A zero field takes its default.
type Layout struct {
	Inline    int // inline payload bytes per slot, a multiple of 64 (default 512)
	Arena     int // payload arena bytes per direction, a multiple of 64 (default 4 MiB)
	AbortBits int // bits in the abort bitmap (default 258)
}

// WithDefaults returns l with zero fields replaced by their defaults.
func (l Layout) WithDefaults() Layout {
	if l.Inline == 0 {
		l.Inline = DefaultInline
	}
	if l.Arena == 0 {
		l.Arena = DefaultArena
	}
	if l.AbortBits == 0 {
		l.AbortBits = DefaultAbortBits
	}
	return l
}

func (l Layout) check() error {
	switch {
	case l.Inline < line || l.Inline > MaxInline || l.Inline%line != 0:
		return fmt.Errorf("%w: inline size %d (want a multiple of 64 in [64, %d])", ErrLayout, l.Inline, MaxInline)
	case l.Arena < 0 || l.Arena > MaxArena || l.Arena%line != 0:
		return fmt.Errorf("%w: arena size %d (want a multiple of 64 up to %d)", ErrLayout, l.Arena, MaxArena)
	case l.AbortBits < 1 || l.AbortBits > MaxAbortBits:
		return fmt.Errorf("%w: abort bits %d (want 1..%d)", ErrLayout, l.AbortBits, MaxAbortBits)
	}
	return nil
}

// Control block offsets.
const (
	offMagic       = 0
	offVersion     = 4
	offTotal       = 8 // u64
	offSlots       = 16
	offInline      = 20
	offStride      = 24
	offHeader      = 28
	offArena       = 32
	offAbortBits   = 36
	offLane        = 40
	offIncarnation = 44
	offEpoch       = 48 // i64, host debug epoch (unix nanoseconds)
	offParts       = 56 // u32 × nParts, up to 84
	offBoot        = 128
	offFatalLen    = 132
	offFatal       = 192 // FatalBytes, to the end of the control block
)

// The control block's fields must not overlap: a long fatal message once overwrote the
// boot word and its own length (protocol version 1).
const (
	_ uint = offBoot - (offParts + 4*nParts)
	_ uint = offFatal - (offFatalLen + 4)
	_ uint = ctrlBytes - (offFatal + FatalBytes)
	_ uint = (offFatal + FatalBytes) - ctrlBytes
)

// Parts of a region, in order.
const (
	partSignals = iota
	partReqRing
	partRetRing
	partReqArena
	partRetArena
	partAbort
	partStats
	nParts
)

// Signal strip offsets, relative to the strip: each word on its own line.
const (
	sigWake   = 0   // wake counter, the futex word the lane parks on
	sigAwake  = 64  // 1 while the lane is awake (spinning or working), 0 when parked
	sigOpen   = 128 // set by the host once the lane is open: it may claim from a shared ring
	sigStop   = 192 // stop word
	sigAbort  = 256 // abort doorbell counter, bumped when an abort bit is set
	sigBeat   = 320 // heartbeat counter, bumped by a lane process's runtime (not its tasks)
	sigRun    = 384 // running word: the sequence number of the call the lane started last
	sigChunk  = 392 // chunk word: how many elements of its running Map chunk the lane started (ChunkWord)
	sigSince  = 448 // when the lane started the call it runs, if that call has a hard timeout
	sigGate   = 512 // gate word: the last call of its own ring the lane started, or a fence (Gate)
	sigBytes  = 576
	ringCtrl  = 256 // ring control sector: producer word +0, consumer word +64 (and room word +96), arm words +128 and +192
	statBytes = 3 * line
)

// Boot states, stored in the control block by the lane.
const (
	BootBooting uint32 = iota
	BootReady
	BootFailed
)

// Stop word values.
const (
	StopRunning      uint32 = 0
	StopRequested    uint32 = 1
	StopAcknowledged uint32 = 2
	// StopAbandoned: the host gave up on a goroutine lane that did not acknowledge; it
	// must start no more calls (a stealing lane's claimed ones included).
	StopAbandoned uint32 = 3
)

// ErrLayout reports a region whose control block does not describe a valid layout.
var ErrLayout = errors.New("knit/fastpath: invalid region layout")

func align(n int) int { return (n + line - 1) &^ (line - 1) }

func abortBytes(bits int) int { return align((bits + 31) / 32 * 4) }

// offsets computes the part offsets and total size of a layout.
func (l Layout) offsets() (parts [nParts]int, total int) {
	stride := HeaderBytes + l.Inline
	ring := ringCtrl + Slots*stride
	off := ctrlBytes
	sizes := [nParts]int{sigBytes, ring, ring, l.Arena, l.Arena, abortBytes(l.AbortBits), statBytes}
	for i, n := range sizes {
		parts[i] = off
		off += align(n)
	}
	return parts, off
}

// Size returns the bytes a region with this layout needs.
func (l Layout) Size() int {
	_, total := l.WithDefaults().offsets()
	return total
}

// Region is a view of one lane's shared memory.
type Region struct {
	mem    []byte
	layout Layout
	parts  [nParts]int
}

// NewRegion formats mem as a fresh region. mem must be zeroed, 64-byte aligned and at least
// layout.Size() bytes.
func NewRegion(mem []byte, layout Layout, lane, incarnation uint32, epoch int64) (*Region, error) {
	layout = layout.WithDefaults()
	if err := layout.check(); err != nil {
		return nil, err
	}
	parts, total := layout.offsets()
	if len(mem) < total {
		return nil, fmt.Errorf("%w: %d bytes, layout needs %d", ErrLayout, len(mem), total)
	}
	le := binary.LittleEndian
	le.PutUint32(mem[offVersion:], Version)
	le.PutUint64(mem[offTotal:], uint64(total))
	le.PutUint32(mem[offSlots:], Slots)
	le.PutUint32(mem[offInline:], uint32(layout.Inline))
	le.PutUint32(mem[offStride:], uint32(HeaderBytes+layout.Inline))
	le.PutUint32(mem[offHeader:], HeaderBytes)
	le.PutUint32(mem[offArena:], uint32(layout.Arena))
	le.PutUint32(mem[offAbortBits:], uint32(layout.AbortBits))
	le.PutUint32(mem[offLane:], lane)
	le.PutUint32(mem[offIncarnation:], incarnation)
	le.PutUint64(mem[offEpoch:], uint64(epoch))
	for i, p := range parts {
		le.PutUint32(mem[offParts+4*i:], uint32(p))
	}
	// The magic goes last, atomically, so a reader never sees a half-written control block.
	shm.U32(mem, offMagic).Store(Magic)
	return &Region{mem: mem[:total], layout: layout, parts: parts}, nil
}

// OpenRegion validates mem as a region built by NewRegion, possibly in another process.
// Every size is checked against the limits and recomputed: a mismatch is an error wrapping
// ErrLayout, never a panic.
func OpenRegion(mem []byte) (*Region, error) {
	if len(mem) < ctrlBytes {
		return nil, fmt.Errorf("%w: %d bytes is smaller than a control block", ErrLayout, len(mem))
	}
	le := binary.LittleEndian
	if m := shm.U32(mem, offMagic).Load(); m != Magic {
		return nil, fmt.Errorf("%w: bad magic %#x", ErrLayout, m)
	}
	if v := le.Uint32(mem[offVersion:]); v != Version {
		return nil, fmt.Errorf("%w: protocol version %d, want %d", ErrLayout, v, Version)
	}
	if s, h := le.Uint32(mem[offSlots:]), le.Uint32(mem[offHeader:]); s != Slots || h != HeaderBytes {
		return nil, fmt.Errorf("%w: %d slots of %d-byte headers, want %d of %d", ErrLayout, s, h, Slots, HeaderBytes)
	}
	inline, stride := le.Uint32(mem[offInline:]), le.Uint32(mem[offStride:])
	arena, abort := le.Uint32(mem[offArena:]), le.Uint32(mem[offAbortBits:])
	if inline > MaxInline || arena > MaxArena || abort > MaxAbortBits {
		return nil, fmt.Errorf("%w: sizes out of range (inline %d, arena %d, abort bits %d)", ErrLayout, inline, arena, abort)
	}
	l := Layout{Inline: int(inline), Arena: int(arena), AbortBits: int(abort)}
	if err := l.check(); err != nil {
		return nil, err
	}
	if int(stride) != HeaderBytes+l.Inline {
		return nil, fmt.Errorf("%w: slot stride %d, want %d", ErrLayout, stride, HeaderBytes+l.Inline)
	}
	parts, total := l.offsets()
	if t := le.Uint64(mem[offTotal:]); t != uint64(total) || total > len(mem) {
		return nil, fmt.Errorf("%w: total size %d, layout needs %d, mapping has %d", ErrLayout, t, total, len(mem))
	}
	for i, p := range parts {
		if got := le.Uint32(mem[offParts+4*i:]); got != uint32(p) {
			return nil, fmt.Errorf("%w: part %d at offset %d, want %d", ErrLayout, i, got, p)
		}
	}
	return &Region{mem: mem[:total], layout: l, parts: parts}, nil
}

// Layout returns the region's sizes.
func (r *Region) Layout() Layout { return r.layout }

// Bytes returns the whole region.
func (r *Region) Bytes() []byte { return r.mem }

// Lane and Incarnation identify the lane the region was made for.
func (r *Region) Lane() uint32 { return binary.LittleEndian.Uint32(r.mem[offLane:]) }

// Incarnation is the lane's restart count when the region was made.
func (r *Region) Incarnation() uint32 { return binary.LittleEndian.Uint32(r.mem[offIncarnation:]) }

// Epoch is the host's debug epoch in unix nanoseconds.
func (r *Region) Epoch() int64 { return int64(binary.LittleEndian.Uint64(r.mem[offEpoch:])) }

// Boot returns the boot state word.
func (r *Region) Boot() *atomic.Uint32 { return shm.U32(r.mem, offBoot) }

// SetFatal records why a lane failed (truncated to the area) and marks boot failed.
func (r *Region) SetFatal(msg string) {
	n := copy(r.mem[offFatal:offFatal+FatalBytes], msg)
	shm.U32(r.mem, offFatalLen).Store(uint32(n))
	r.Boot().Store(BootFailed)
}

// Fatal returns the fatal message a lane left, or "" if none. The length is hostile: it is
// clamped to the area.
func (r *Region) Fatal() string {
	n := int(shm.U32(r.mem, offFatalLen).Load())
	n = min(n, FatalBytes)
	return string(r.mem[offFatal : offFatal+n])
}

func (r *Region) sig(off int) *atomic.Uint32 { return shm.U32(r.mem, r.parts[partSignals]+off) }

// Stop returns the stop word (StopRunning, StopRequested, StopAcknowledged).
func (r *Region) Stop() *atomic.Uint32 { return r.sig(sigStop) }

// Open returns the word the host sets once the lane is open (its supervisor has it take
// calls): a lane of a stealing pool claims from the shared ring only from then on, so no
// call runs on a lane the host does not count as ready yet.
func (r *Region) Open() *atomic.Uint32 { return r.sig(sigOpen) }

// LaneWake returns the doorbell the lane parks on: it is rung for new calls and for stop requests.
func (r *Region) LaneWake() *Wake { return &Wake{counter: r.sig(sigWake), awake: r.sig(sigAwake)} }

// Heartbeat returns the counter a lane process's runtime bumps at a steady pace, whatever its
// tasks do: a host that sees it stand still knows the process is frozen. A lane parked with
// nothing to do may pause it (BeatPaused).
func (r *Region) Heartbeat() *atomic.Uint32 { return r.sig(sigBeat) }

// BeatPaused is set in a heartbeat word whose lane has paused its heartbeat: it was parked
// for a whole beat with nothing to do, and beats again once it wakes. A paused beat stands
// still by design, so the host counts it as frozen only while calls wait for the lane.
const BeatPaused uint32 = 1 << 31

// Running returns the lane's running word: Running(seq, busy) of the call it started last.
// The host reads it after the lane has died, to tell the calls that had started (a sequence
// number up to Started) from those that provably had not.
func (r *Region) Running() *atomic.Uint64 { return shm.U64(r.mem, r.parts[partSignals]+sigRun) }

// Since returns the word a process lane sets, in Unix nanoseconds, when it starts a call
// whose task has a HardTimeout: the host measures the hard timeout from it, not from when the
// call was queued. A lane can write anything here: the host only ever uses it to kill that
// same lane later or sooner.
func (r *Region) Since() *atomic.Int64 { return shm.I64(r.mem, r.parts[partSignals]+sigSince) }

// Gate returns the lane's gate word (see Gate).
func (r *Region) Gate() Gate { return Gate{w: shm.U64(r.mem, r.parts[partSignals]+sigGate)} }

// RunningWord encodes the running word: the call with sequence number seq, and whether it is
// still running.
func RunningWord(seq uint64, busy bool) uint64 {
	if busy {
		return seq<<1 | 1
	}
	return seq << 1
}

// Started decodes a running word: the sequence number of the last call the lane started.
func Started(word uint64) uint64 { return word >> 1 }

// Busy decodes a running word: whether the lane is running calls (false: it looks for
// work). A stealing pool's host rings no lane while one is awake and not busy.
func Busy(word uint64) bool { return word&1 != 0 }

// Chunk returns the lane's chunk word: ChunkWord(seq, started) of the Map chunk it runs
// (actors.TwinSuffix). The host reads it after the lane has died, as the running word, to
// tell the chunk's elements that had started from those that may run elsewhere.
func (r *Region) Chunk() *atomic.Uint64 { return shm.U64(r.mem, r.parts[partSignals]+sigChunk) }

// ChunkWord encodes a chunk word: the chunk's sequence number and how many of its elements
// the lane started (at most 1<<chunkBits - 1).
func ChunkWord(seq uint64, started int) uint64 { return seq<<chunkBits | uint64(started) }

// ChunkStarted decodes a chunk word for the chunk published with sequence number seq: how
// many of its elements had started, or false when the word is another chunk's.
func ChunkStarted(word, seq uint64) (int, bool) {
	if seq == 0 || word>>chunkBits != seq {
		return 0, false
	}
	return int(word & (1<<chunkBits - 1)), true
}

const chunkBits = 13

// AbortWake returns the counter a lane's abort watcher parks on.
func (r *Region) AbortWake() *atomic.Uint32 { return r.sig(sigAbort) }

// Requests returns the host → lane ring.
func (r *Region) Requests() Ring { return r.ring(partReqRing, partReqArena) }

// Returns returns the lane → host ring.
func (r *Region) Returns() Ring { return r.ring(partRetRing, partRetArena) }

func (r *Region) ring(ring, arena int) Ring {
	off, aoff := r.parts[ring], r.parts[arena]
	return Ring{
		ctrl:   r.mem[off : off+ringCtrl],
		slots:  r.mem[off+ringCtrl : off+ringCtrl+Slots*(HeaderBytes+r.layout.Inline)],
		arena:  r.mem[aoff : aoff+r.layout.Arena],
		inline: r.layout.Inline,
	}
}

// Aborts returns the abort bitmap.
func (r *Region) Aborts() Bitmap {
	off := r.parts[partAbort]
	return Bitmap{mem: r.mem[off : off+abortBytes(r.layout.AbortBits)], bits: r.layout.AbortBits}
}

// Stats returns the counters the lane writes.
func (r *Region) Stats() Stats {
	off := r.parts[partStats]
	return Stats{
		Completed: shm.U64(r.mem, off),
		Failed:    shm.U64(r.mem, off+line),
		BusyNanos: shm.U64(r.mem, off+2*line),
	}
}

// Stats are per-lane counters written by the lane and read by the host.
type Stats struct {
	Completed, Failed, BusyNanos *atomic.Uint64
}

// StatsSnapshot is a copy of a lane's counters.
type StatsSnapshot struct{ Completed, Failed, BusyNanos uint64 }

// Snapshot copies the counters.
func (s Stats) Snapshot() StatsSnapshot {
	return StatsSnapshot{Completed: s.Completed.Load(), Failed: s.Failed.Load(), BusyNanos: s.BusyNanos.Load()}
}
