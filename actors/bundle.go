package actors

import (
	"encoding/binary"
	"fmt"

	"github.com/knitgo/knit/fastpath"
)

// A process lane's request ring has 32 slots: a slot per call wakes the lane once for every
// 32 calls at most, however many wait in the ring's backlog. When calls wait there, the host
// moves them into a slot together, as a bundle (the Bundle flag): the slot's payload holds
// each call's header and input, and the calls are numbered one after the other from the
// slot's sequence number. The lane runs a bundle's calls as if each had a slot of its own —
// the gate, its running word and its results are per call — so the host settles them, and
// tells which had started when the lane dies, as it does calls in slots.

// Bundle marks a request slot that carries several calls (its flags; the lane answers each
// on a result slot of its own).
const Bundle uint32 = 1 << 30

// MaxBundle is the most calls a bundle carries.
const MaxBundle = 64

// bundleHead is the size of a call's header in a bundle: function, call id, generation,
// abort bit + 1, deadline, input length.
const bundleHead = 4 + 4 + 4 + 4 + 8 + 4

// bundleSize is the payload of a bundle of calls.
func bundleSize(calls []Call) int {
	n := 0
	for i := range calls {
		n += bundleHead + len(calls[i].Payload)
	}
	return n
}

// putBundle writes calls into buf (bundleSize long).
func putBundle(buf []byte, calls []Call) {
	for i := range calls {
		c := &calls[i]
		binary.LittleEndian.PutUint32(buf[0:], c.Def.Index())
		binary.LittleEndian.PutUint32(buf[4:], c.ID)
		binary.LittleEndian.PutUint32(buf[8:], c.Gen)
		binary.LittleEndian.PutUint32(buf[12:], uint32(c.Abort.Load()+1))
		binary.LittleEndian.PutUint64(buf[16:], uint64(c.Deadline))
		binary.LittleEndian.PutUint32(buf[24:], uint32(len(c.Payload)))
		buf = buf[bundleHead+copy(buf[bundleHead:], c.Payload):]
	}
}

// nextInBundle reads the call at the start of a bundle's payload b into w (seq set by the
// caller) and returns its input and the rest of b. A header that breaks the framing is
// ErrCorrupt: the host wrote it, and a lane must not guess.
func nextInBundle(b []byte, w *work) (input, rest []byte, err error) {
	if len(b) < bundleHead {
		return nil, nil, fmt.Errorf("%w: bundle: %d bytes left, want a %d-byte call header", fastpath.ErrCorrupt, len(b), bundleHead)
	}
	n := binary.LittleEndian.Uint32(b[24:])
	if uint64(n) > uint64(len(b)-bundleHead) {
		return nil, nil, fmt.Errorf("%w: bundle: a call of %d bytes, %d left", fastpath.ErrCorrupt, n, len(b)-bundleHead)
	}
	w.fn, w.id, w.gen = binary.LittleEndian.Uint32(b[0:]), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:])
	w.abort, w.deadline, w.flags = binary.LittleEndian.Uint32(b[12:]), int64(binary.LittleEndian.Uint64(b[16:])), 0
	return b[bundleHead : bundleHead+n], b[bundleHead+n:], nil
}
