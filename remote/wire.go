package remote

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// The wire protocol between a host's pool and a node. Every message is one frame: knit's own
// versioned binary encoding, carried as the bytes of a protobuf BytesValue (the only message
// type either side accepts), so that there is no generated code and one decoder to fuzz.
//
//	frame  = 'k' 'n' version:u8 kind:u8 session:[16]byte lane:uvarint inc:uvarint body
//
// The body of Calls, Results and Cancel frames is a run of items up to the end of the frame;
// the others are a fixed sequence of fields. Integers are unsigned varints (encoding/binary),
// a signed one is zig-zag (binary.AppendVarint), strings and payloads are a uvarint length
// and that many bytes. A frame comes from a peer: Parse and the body decoders check every
// length against the frame and against the limits below, and return an error wrapping
// ErrFrame, never panic.

// Version is the wire protocol's version: host and node refuse each other's frames when it
// differs.
const Version = 3 // 2: Ended carries Began; 3: Call carries NoCancel

// Kind is what a frame carries.
type Kind uint8

// Frame kinds. Host → node: Open, Calls, Cancel, Stop, Ping, Bye. Node → host: Ready,
// Failed, Results, Ended, Pong.
const (
	KindOpen    Kind = 1 + iota // start a lane: the handshake, with the tasks' fingerprints
	KindReady                   // the lane serves
	KindFailed                  // the lane could not start
	KindCalls                   // calls for a lane, in order
	KindResults                 // results of a lane's calls
	KindCancel                  // calls whose callers gave up
	KindStop                    // stop a lane: gracefully, or kill it at once
	KindEnded                   // a lane ended: how, and which calls had started
	KindPing                    // the host's heartbeat
	KindPong                    // the node's answer
	KindBye                     // the host leaves: drop the session's lanes
	kindEnd
)

var kindNames = [...]string{KindOpen: "open", KindReady: "ready", KindFailed: "failed", KindCalls: "calls",
	KindResults: "results", KindCancel: "cancel", KindStop: "stop", KindEnded: "ended", KindPing: "ping",
	KindPong: "pong", KindBye: "bye"}

func (k Kind) String() string {
	if k > 0 && k < kindEnd {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Limits of what a frame may hold. A sender keeps its frames under FrameTarget by starting
// a new one (a single call or result may take it up to MaxPayload); a receiver refuses
// anything over the maxima.
const (
	// MaxPayload bounds one call's input or one result: a remote pool's Payload.MaxCall is
	// at most this.
	MaxPayload = 4 << 20
	// MaxFrame bounds a frame.
	MaxFrame = MaxPayload + 64<<10
	// FrameTarget is the size at which a sender closes a frame and starts the next.
	FrameTarget = 256 << 10
	maxName     = 1 << 10  // a task name, an address, a code
	maxText     = 16 << 10 // a message, a stack or stderr line
	maxLines    = 64       // stack and stderr lines in an Ended frame
	maxTasks    = 1 << 14
	maxBegan    = 1 << 12 // elements of a Map chunk (actors.MaxChunk; wire_test checks)
)

// ErrFrame is the error of a frame that does not decode.
var ErrFrame = errors.New("remote: malformed frame")

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFrame, fmt.Sprintf(format, args...))
}

// Session names one host pool's connection to one node: chosen at random by the host, new
// after every loss of the node, so that what is left of an old session is never mistaken
// for the current one.
type Session [16]byte

// Frame is a parsed frame: its header, and its body still encoded.
type Frame struct {
	Kind    Kind
	Session Session
	Lane    uint32
	Inc     uint32
	body    []byte
}

// AppendHeader starts a frame.
func AppendHeader(dst []byte, k Kind, s Session, lane, inc uint32) []byte {
	dst = append(dst, 'k', 'n', Version, byte(k))
	dst = append(dst, s[:]...)
	dst = binary.AppendUvarint(dst, uint64(lane))
	return binary.AppendUvarint(dst, uint64(inc))
}

// Parse reads a frame's header.
func Parse(b []byte) (Frame, error) {
	var f Frame
	switch {
	case len(b) > MaxFrame:
		return f, bad("%d bytes", len(b))
	case len(b) < 4+len(f.Session) || b[0] != 'k' || b[1] != 'n':
		return f, bad("no frame header")
	case b[2] != Version:
		return f, fmt.Errorf("%w: wire protocol version %d, this side speaks %d", ErrVersion, b[2], Version)
	}
	f.Kind = Kind(b[3])
	if f.Kind == 0 || f.Kind >= kindEnd {
		return f, bad("unknown kind %d", b[3])
	}
	copy(f.Session[:], b[4:])
	d := decoder{b: b[4+len(f.Session):]}
	f.Lane, f.Inc = d.u32(), d.u32()
	if d.err != nil {
		return f, d.err
	}
	f.body = d.b
	return f, nil
}

// ErrVersion is Parse's error for a frame of another protocol version.
var ErrVersion = errors.New("remote: wire protocol version mismatch")

// decoder reads a body; the first error sticks and every later read returns zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = bad(format, args...)
	}
	d.b = nil
}

func (d *decoder) uv() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// sv reads a signed varint: binary.Varint's zig-zag over uv.
func (d *decoder) sv() int64 {
	u := d.uv()
	return int64(u>>1) ^ -int64(u&1)
}

func (d *decoder) u32() uint32 {
	v := d.uv()
	if v > math.MaxUint32 {
		d.fail("%d over 32 bits", v)
		return 0
	}
	return uint32(v)
}

func (d *decoder) byte1() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// bytes reads a length-prefixed run of at most max bytes, aliasing the frame.
func (d *decoder) bytes(max int) []byte {
	n := d.uv()
	if d.err != nil {
		return nil
	}
	if n > uint64(max) || n > uint64(len(d.b)) {
		d.fail("%d bytes where at most %d fit", n, min(max, len(d.b)))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(max int) string { return string(d.bytes(max)) }

func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes after the last field", len(d.b))
	}
	return d.err
}

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

func appendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// Open is the handshake that starts a lane: who the host is and where it listens, the
// session's settings, and the host's tasks with their fingerprints, which the node checks
// against its own before the lane serves.
type Open struct {
	// Reply is the host's address, and ReplyActor its pool's receiving actor: where the
	// node sends this session's frames.
	Reply, ReplyActor string
	Liveness          time.Duration // the host's Config.Liveness: the node fences the session after as long a silence
	Lanes             uint32        // the host pool's lanes (lane indices are below it)
	Flags             uint32        // OpenCarry, OpenPanicCrash
	Inline            uint32        // the host pool's Payload
	Arena             uint32
	MaxCall           uint32
	Tasks             []TaskRef
}

// Open flags.
const (
	OpenCarry      = 1 << iota // each input opens with carried context fields (Config.Propagator)
	OpenPanicCrash             // a task panic crashes the lane (Config.PanicCrashesLane)
)

// TaskRef is a task as the host knows it: its name, its fingerprint, and the function index
// its calls carry.
type TaskRef struct {
	Name        string
	Fingerprint uint64
	Index       uint32
}

// AppendOpen appends o's body to a frame.
func AppendOpen(dst []byte, o *Open) []byte {
	dst = appendStr(appendStr(dst, o.Reply), o.ReplyActor)
	dst = binary.AppendUvarint(dst, uint64(o.Liveness))
	for _, v := range [...]uint32{o.Lanes, o.Flags, o.Inline, o.Arena, o.MaxCall} {
		dst = binary.AppendUvarint(dst, uint64(v))
	}
	dst = binary.AppendUvarint(dst, uint64(len(o.Tasks)))
	for _, t := range o.Tasks {
		dst = appendStr(dst, t.Name)
		dst = binary.LittleEndian.AppendUint64(dst, t.Fingerprint)
		dst = binary.AppendUvarint(dst, uint64(t.Index))
	}
	return dst
}

// Open decodes an Open frame's body.
func (f Frame) Open() (Open, error) {
	var o Open
	if f.Kind != KindOpen {
		return o, bad("%v frame read as open", f.Kind)
	}
	d := decoder{b: f.body}
	o.Reply, o.ReplyActor = d.str(maxName), d.str(maxName)
	live := d.uv()
	if live > math.MaxInt64 {
		d.fail("liveness %d", live)
	}
	o.Liveness = time.Duration(live)
	o.Lanes, o.Flags, o.Inline, o.Arena, o.MaxCall = d.u32(), d.u32(), d.u32(), d.u32(), d.u32()
	n := d.uv()
	if n > maxTasks || n > uint64(len(d.b)) {
		d.fail("%d tasks", n)
		n = 0
	}
	o.Tasks = make([]TaskRef, 0, n)
	for range n {
		t := TaskRef{Name: d.str(maxName), Fingerprint: d.u64(), Index: d.u32()}
		if d.err != nil {
			break
		}
		o.Tasks = append(o.Tasks, t)
	}
	return o, d.end()
}

// AppendReady appends a Ready frame's body: the lane's process on the node.
func AppendReady(dst []byte, pid int) []byte { return binary.AppendUvarint(dst, uint64(max(pid, 0))) }

// Ready decodes a Ready frame's body.
func (f Frame) Ready() (pid int, err error) {
	if f.Kind != KindReady {
		return 0, bad("%v frame read as ready", f.Kind)
	}
	d := decoder{b: f.body}
	pid = int(d.u32() & math.MaxInt32)
	return pid, d.end()
}

// AppendFailed appends a Failed frame's body: why the lane could not start.
func AppendFailed(dst []byte, code, msg string) []byte {
	return appendStr(appendStr(dst, clip(code, maxName)), clip(msg, maxText))
}

// Failed decodes a Failed frame's body.
func (f Frame) Failed() (code, msg string, err error) {
	if f.Kind != KindFailed {
		return "", "", bad("%v frame read as failed", f.Kind)
	}
	d := decoder{b: f.body}
	code, msg = d.str(maxName), d.str(maxText)
	return code, msg, d.end()
}

// Call is one call in a Calls frame.
type Call struct {
	Seq uint64 // its sequence number on the host's lane
	Fn  uint32 // the host's function index (TaskRef.Index)
	// Timeout is how long the caller still waited when the host sent it (0: no deadline;
	// negative: none left): the node's clock sets the deadline from it, as clocks differ.
	Timeout time.Duration
	// NoCancel says its caller cannot give up on it (its context has no Done channel): no
	// Cancel will name it, so the node may run it in one chunk with the calls beside it.
	NoCancel bool
	Payload  []byte // the encoded input
}

// AppendCall appends a call to a Calls frame.
func AppendCall(dst []byte, c *Call) []byte {
	dst = binary.AppendUvarint(dst, c.Seq)
	dst = binary.AppendUvarint(dst, uint64(c.Fn))
	dst = binary.AppendVarint(dst, int64(c.Timeout))
	dst = appendBool(dst, c.NoCancel)
	return appendBytes(dst, c.Payload)
}

// Items iterates over the items of a Calls, Results or Cancel frame.
type Items struct {
	d    decoder
	kind Kind
}

// Items returns the iterator over the frame's items.
func (f Frame) Items() Items { return Items{d: decoder{b: f.body}, kind: f.Kind} }

// More reports whether another item follows (false after an error too).
func (it *Items) More() bool { return it.d.err == nil && len(it.d.b) > 0 }

// Err is the first decoding error.
func (it *Items) Err() error { return it.d.err }

// Call decodes the next call (its payload aliases the frame).
func (it *Items) Call() (c Call) {
	if it.kind != KindCalls {
		it.d.fail("%v frame read as calls", it.kind)
		return c
	}
	c.Seq, c.Fn, c.Timeout = it.d.uv(), it.d.u32(), time.Duration(it.d.sv())
	c.NoCancel = it.d.byte1() != 0
	c.Payload = it.d.bytes(MaxPayload)
	return c
}

// Result is one result in a Results frame.
type Result struct {
	Seq     uint64
	Outcome uint32 // actors.Outcome
	Ran     uint64 // how long it ran on the lane, ns (0: not timed)
	Payload []byte // the encoded output, or the encoded error
}

// AppendResult appends a result to a Results frame.
func AppendResult(dst []byte, r *Result) []byte {
	dst = binary.AppendUvarint(dst, r.Seq)
	dst = binary.AppendUvarint(dst, uint64(r.Outcome))
	dst = binary.AppendUvarint(dst, r.Ran)
	return appendBytes(dst, r.Payload)
}

// Result decodes the next result (its payload aliases the frame).
func (it *Items) Result() (r Result) {
	if it.kind != KindResults {
		it.d.fail("%v frame read as results", it.kind)
		return r
	}
	r.Seq, r.Outcome, r.Ran = it.d.uv(), it.d.u32(), it.d.uv()
	r.Payload = it.d.bytes(MaxPayload)
	return r
}

// AppendCancel appends a cancelled call's sequence number to a Cancel frame.
func AppendCancel(dst []byte, seq uint64) []byte { return binary.AppendUvarint(dst, seq) }

// Cancel decodes the next cancelled call's sequence number.
func (it *Items) Cancel() uint64 {
	if it.kind != KindCancel {
		it.d.fail("%v frame read as cancel", it.kind)
		return 0
	}
	return it.d.uv()
}

// AppendStop appends a Stop frame's body: kill at once, or stop once the calls are done.
func AppendStop(dst []byte, kill bool, reason string) []byte {
	return appendStr(appendBool(dst, kill), clip(reason, maxText))
}

// Stop decodes a Stop frame's body.
func (f Frame) Stop() (kill bool, reason string, err error) {
	if f.Kind != KindStop {
		return false, "", bad("%v frame read as stop", f.Kind)
	}
	d := decoder{b: f.body}
	kill, reason = d.byte1() != 0, d.str(maxText)
	return kill, reason, d.end()
}

// Ended is how a lane on a node ended.
type Ended struct {
	Code    string // a lifecycle code
	Message string
	Normal  bool // it ended on its own with success
	// Started is the host sequence number of the last call the lane had started (every call
	// up to it had; none after it), and Busy whether that one was still running.
	Started uint64
	Busy    bool
	// Began is, when the call at Started was a Map chunk still running (Busy), how many of
	// its elements the lane had started (fastpath.ChunkWord); -1 when not known.
	Began int
	Stack []string // the lane process's own account of its crash (lifecycle.LaneReport)
	Tail  []string
}

// AppendEnded appends an Ended frame's body.
func AppendEnded(dst []byte, e *Ended) []byte {
	dst = appendStr(dst, clip(e.Code, maxName))
	dst = appendStr(dst, clip(e.Message, maxText))
	dst = appendBool(dst, e.Normal)
	dst = binary.AppendUvarint(dst, e.Started)
	dst = appendBool(dst, e.Busy)
	dst = binary.AppendUvarint(dst, uint64(max(e.Began, -1)+1)) // 0: not known
	for _, lines := range [...][]string{e.Stack, e.Tail} {
		lines = lines[:min(len(lines), maxLines)]
		dst = binary.AppendUvarint(dst, uint64(len(lines)))
		for _, l := range lines {
			dst = appendStr(dst, clip(l, maxText))
		}
	}
	return dst
}

// Ended decodes an Ended frame's body.
func (f Frame) Ended() (Ended, error) {
	var e Ended
	if f.Kind != KindEnded {
		return e, bad("%v frame read as ended", f.Kind)
	}
	d := decoder{b: f.body}
	e.Code, e.Message = d.str(maxName), d.str(maxText)
	e.Normal = d.byte1() != 0
	e.Started = d.uv()
	e.Busy = d.byte1() != 0
	if b := d.uv(); b > maxBegan+1 {
		d.fail("%d elements begun", b-1)
	} else {
		e.Began = int(b) - 1
	}
	for _, lines := range [...]*[]string{&e.Stack, &e.Tail} {
		n := d.uv()
		if n > maxLines {
			d.fail("%d lines", n)
			break
		}
		for range n {
			*lines = append(*lines, d.str(maxText))
		}
	}
	return e, d.end()
}

// AppendPing appends a Ping frame's body: a nonce the Pong returns, and where the host
// listens and its pool's actor (the node answers a session it does not know, too).
func AppendPing(dst []byte, nonce uint64, reply, actor string) []byte {
	return appendStr(appendStr(binary.AppendUvarint(dst, nonce), clip(reply, maxName)), clip(actor, maxName))
}

// Ping decodes a Ping frame's body.
func (f Frame) Ping() (nonce uint64, reply, actor string, err error) {
	if f.Kind != KindPing {
		return 0, "", "", bad("%v frame read as ping", f.Kind)
	}
	d := decoder{b: f.body}
	nonce, reply, actor = d.uv(), d.str(maxName), d.str(maxName)
	return nonce, reply, actor, d.end()
}

// AppendPong appends a Pong frame's body: the Ping's nonce, and whether the node knows the
// session (a node that does not has dropped the host's lanes: it restarted, or fenced them).
func AppendPong(dst []byte, nonce uint64, known bool) []byte {
	return appendBool(binary.AppendUvarint(dst, nonce), known)
}

// Pong decodes a Pong frame's body.
func (f Frame) Pong() (nonce uint64, known bool, err error) {
	if f.Kind != KindPong {
		return 0, false, bad("%v frame read as pong", f.Kind)
	}
	d := decoder{b: f.body}
	nonce, known = d.uv(), d.byte1() != 0
	return nonce, known, d.end()
}

// clip cuts s to at most n bytes (a peer's limit is the receiver's: never send what it
// would refuse).
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
