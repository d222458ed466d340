package actors

import (
	"context"
	"encoding/binary"
	"fmt"
	"iter"
	"reflect"
)

// A Map of a task whose lanes live in other processes moves its elements in chunks, each one
// call of the task's twin: a task Define registers beside every task, named with TwinSuffix,
// whose input is a slice of the task's inputs and whose output is every element's outcome.
// A chunk of elements is then one slot, one wake-up of the lane and one settlement on the
// host, where each element alone would take a slot, and a lane of 32 slots would wake once
// for every 32 elements at most. The twin is an ordinary task to everything between Map and
// the lane — rings, backlogs, settlement when a lane dies, Idempotent, aborts — so a chunk
// settles as one call; the lane runs the elements one after the other (RunChunk).

// TwinSuffix ends the name of every task's twin. Define refuses task names that end so.
const TwinSuffix = " (Map chunk)"

// MaxChunk is the most elements a chunk's input may hold: a lane refuses larger ones (and
// fastpath.ChunkWord counts up to it).
const MaxChunk = 1 << 12

// chunkIn is the twin's input codec: a count, then each element's encoding with its length.
type chunkIn[In any] struct{ elem Codec[In] }

func (c chunkIn[In]) Name() string { return "chunk of " + c.elem.Name() }

func (c chunkIn[In]) Append(dst []byte, v []In) ([]byte, error) {
	if len(v) > MaxChunk {
		return dst, fmt.Errorf("a chunk of %d elements, at most %d", len(v), MaxChunk)
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(v)))
	for i := range v {
		at := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		var err error
		if dst, err = c.elem.Append(dst, v[i]); err != nil {
			return dst, err
		}
		binary.LittleEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	}
	return dst, nil
}

func (c chunkIn[In]) Decode(b []byte) ([]In, error) {
	n, err := ChunkCount(b)
	if err != nil {
		return nil, err
	}
	out := make([]In, 0, n)
	for e, err := range chunkElements(b[4:], n, false) {
		if err != nil {
			return nil, err
		}
		v, err := c.elem.Decode(e.payload)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// chunkOut is the twin's output codec: its Decode checks that the result is well framed
// (a count, then each element's outcome, length and payload) and copies it.
type chunkOut struct{}

func (chunkOut) Name() string { return "chunk result" }

func (chunkOut) Append(dst []byte, v []byte) ([]byte, error) { return append(dst, v...), nil }

func (chunkOut) Decode(b []byte) ([]byte, error) {
	n, err := ChunkCount(b)
	if err != nil {
		return nil, err
	}
	for _, err := range chunkElements(b[4:], n, true) {
		if err != nil {
			return nil, err
		}
	}
	return append([]byte(nil), b...), nil
}

// ChunkCount reads the element count that opens a chunk's input or result.
func ChunkCount(b []byte) (int, error) {
	if len(b) < 4 {
		return 0, corruptf("chunk of %d bytes, want at least 4", len(b))
	}
	n := binary.LittleEndian.Uint32(b)
	if n > MaxChunk {
		return 0, corruptf("chunk of %d elements, at most %d", n, MaxChunk)
	}
	return int(n), nil
}

// Calls is how many calls a call of d with payload (its input, or its result) stands for:
// a twin's, the elements of its chunk (at least 1); any other, 1. Payloads with no count
// (a goroutine lane's, an error's) count 1.
func Calls(d Def, payload []byte) int {
	if t, ok := d.(interface{ isTwin() bool }); !ok || !t.isTwin() || len(payload) < 4 {
		return 1
	}
	return max(1, min(int(binary.LittleEndian.Uint32(payload)), MaxChunk))
}

func (t *Task[In, Out]) isTwin() bool { return t.chunk != nil }

// ChunkEntry is one element of a chunk: its outcome (results only) and payload.
type ChunkEntry struct {
	Outcome Outcome
	payload []byte
}

// Payload is the entry's payload: the encoded input or output, or the encoded WireError.
func (e ChunkEntry) Payload() []byte { return e.payload }

// ChunkResults yields the n entries of a chunk's result b (as chunkOut.Decode checked it),
// or an error where b breaks the framing.
func ChunkResults(b []byte) (int, iter.Seq2[ChunkEntry, error]) {
	n, err := ChunkCount(b)
	if err != nil {
		return 0, func(yield func(ChunkEntry, error) bool) { yield(ChunkEntry{}, err) }
	}
	return n, chunkElements(b[4:], n, true)
}

// chunkElements yields n entries of b: each an outcome byte (results only), a length and
// that many bytes. It stops at the first error, and fails if bytes are left over.
func chunkElements(b []byte, n int, results bool) iter.Seq2[ChunkEntry, error] {
	return func(yield func(ChunkEntry, error) bool) {
		head := 4
		if results {
			head = 5
		}
		for i := range n {
			if len(b) < head {
				yield(ChunkEntry{}, corruptf("chunk element %d of %d: %d bytes left, want a %d-byte head", i, n, len(b), head))
				return
			}
			var e ChunkEntry
			if results {
				e.Outcome, b = Outcome(b[0]), b[1:]
			}
			size := binary.LittleEndian.Uint32(b)
			if uint64(size) > uint64(len(b)-4) {
				yield(ChunkEntry{}, corruptf("chunk element %d of %d: %d bytes, %d left", i, n, size, len(b)-4))
				return
			}
			e.payload, b = b[4:4+size], b[4+size:]
			if !yield(e, nil) {
				return
			}
		}
		if len(b) != 0 {
			yield(ChunkEntry{}, corruptf("chunk of %d elements: %d bytes left over", n, len(b)))
		}
	}
}

// twinOf makes t's twin (twinMaker gives it the index Define reserved after t's).
func twinOf[In, Out any](t *Task[In, Out]) *Task[[]In, []byte] {
	name := t.name + TwinSuffix
	// Not Idempotent: a chunk that was running when its lane died is never run again as a
	// whole; Map runs its elements again one by one where the task allows it.
	tw := &Task[[]In, []byte]{name: name,
		fp:      Fingerprint(name, reflect.TypeFor[[]In](), reflect.TypeFor[[]byte]()),
		InCodec: chunkIn[In]{t.InCodec}, OutCdc: chunkOut{}}
	tw.inLimit = limiterOf(tw.InCodec)
	tw.fn = func(ctx context.Context, in []In) ([]byte, error) { // in-process: nothing to bound
		out := binary.LittleEndian.AppendUint32(nil, uint32(len(in)))
		var scratch []byte
		for i := range in {
			enc, err := t.InCodec.Append(scratch[:0], in[i])
			if err != nil {
				return nil, err
			}
			out, scratch, _ = t.runElement(ctx, enc, out, scratch[:0])
		}
		return out, nil
	}
	tw.chunk = t.runChunk
	return tw
}

// runChunk runs a chunk's elements one after the other and appends the chunk's result to
// dst. An element starts only while the context is live and the result holds at most half
// of limit; the rest are Stale. An element whose result would take the result over limit
// is Stale too if the task is Idempotent (the host runs it again by itself), else it fails
// PAYLOAD_TOO_LARGE. With crash, a panic ends the chunk as the call's panic (the lane dies).
// mark is told, before each element starts, how many have (fastpath.ChunkWord).
func (t *Task[In, Out]) runChunk(ctx context.Context, in, dst []byte, limit int, crash bool, mark func(started int)) ([]byte, Outcome) {
	n, err := ChunkCount(in)
	if err != nil {
		return EncodeWireError(dst, CodeUnsupportedType, "chunk did not decode: "+err.Error()), BadInput
	}
	out := binary.LittleEndian.AppendUint32(dst, uint32(n))
	var scratch []byte
	started := 0
	for e, err := range chunkElements(in[4:], n, false) {
		if err != nil {
			return EncodeWireError(dst, CodeUnsupportedType, "chunk did not decode: "+err.Error()), BadInput
		}
		if ctx.Err() != nil || len(out) > limit/2 {
			out = appendEntry(out, Stale, nil)
			continue
		}
		started++
		mark(started)
		var o Outcome
		at := len(out)
		out, scratch, o = t.runElement(ctx, e.payload, out, scratch[:0])
		if o == Panicked && crash {
			return scratch, Panicked // the lane's panic report, as a call's
		}
		if len(out) > limit {
			out = out[:at]
			if t.opts.Idempotent {
				out = appendEntry(out, Stale, nil)
			} else {
				msg := fmt.Sprintf("result of %d bytes does not fit the Map chunk's %d-byte result", len(scratch), limit)
				out = appendEntry(out, BadOutput, EncodeWireError(scratch[:0], CodePayloadTooLarge, msg))
			}
		}
	}
	return out, OK
}

// runElement runs one element, encoded as enc, and appends its entry to out. scratch is
// room for the element's output, returned for reuse (and holding it).
func (t *Task[In, Out]) runElement(ctx context.Context, enc, out, scratch []byte) ([]byte, []byte, Outcome) {
	res, o := t.RunEncoded(ctx, enc, scratch)
	return appendEntry(out, o, res), res, o
}

func appendEntry(out []byte, o Outcome, payload []byte) []byte {
	out = append(out, byte(o))
	out = binary.LittleEndian.AppendUint32(out, uint32(len(payload)))
	return append(out, payload...)
}

// RunChunk runs a twin's chunk on a process lane (see runChunk): limit bounds the result,
// crash makes a panic the call's. ok is false for a task that is no twin.
func (t *Task[In, Out]) RunChunk(ctx context.Context, in, dst []byte, limit int, crash bool, mark func(int)) (out []byte, o Outcome, ok bool) {
	if t.chunk == nil {
		return nil, 0, false
	}
	out, o = t.chunk(ctx, in, dst, limit, crash, mark)
	return out, o, true
}

// Twin returns the task's twin, which carries its Map chunks to lanes in other processes,
// registered at the index after the task's. A twin has none.
func (t *Task[In, Out]) Twin() Def {
	registry.Lock()
	defer registry.Unlock()
	return t.twinLocked()
}

// twinLocked is Twin with the registry locked: it makes the twin the first time.
func (t *Task[In, Out]) twinLocked() Def {
	if t.chunk != nil { // a twin
		return nil
	}
	if t.twin == nil {
		t.twin = t.makeTwin(t.index + 1)
		registry.list[t.index+1] = t.twin
		registry.byName[t.twin.Name()] = t.twin
	}
	return t.twin
}

// twinMaker returns Define's maker of t's twin, which makes it with the registry index given.
// (A method of Task cannot make the twin itself: Task[[]In, []byte] would have one too.)
func twinMaker[In, Out any](t *Task[In, Out]) func(index uint32) Def {
	return func(index uint32) Def {
		tw := twinOf(t)
		tw.index = index
		tw.Records.task, tw.Records.def = index, tw
		return tw
	}
}

// Chunker is a Def that may be a twin (every *Task is one): RunChunk says.
type Chunker interface {
	RunChunk(ctx context.Context, in, dst []byte, limit int, crash bool, mark func(started int)) ([]byte, Outcome, bool)
}
