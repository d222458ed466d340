package fastpath

import "sync/atomic"

// Gate is the word through which a host takes back calls it published on a lane's own ring
// that the lane has not started: calls queued behind one that has run far longer than its
// peers (head-of-line blocking), which then run on another lane instead of waiting.
//
// The lane starts each call of its own ring with Enter, one CAS: the word then holds that
// call's sequence number. The host withdraws with Fence, one CAS from the value it read:
// every call after that one, up to the last it published, is fenced. Exactly one of the two
// CASes wins, so a call either started on the lane (the fence failed and nothing moves) or is
// the host's to run elsewhere (the lane sees the fence and skips it). The lane lifts the fence
// when it reaches the last call fenced. While the lane is still behind a fence (it is running
// the same long call), the host may extend the fence over calls published since, again with
// one CAS that the lane's lift can beat: a lane stuck for seconds has its queue taken back at
// every look, not once.
//
// The word is the lane's to write: a lane that writes garbage can at worst have its own calls
// taken back while they run (and run twice), which it could do to them anyway; it cannot
// reach another lane's calls.
type Gate struct{ w *atomic.Uint64 }

const (
	gateFenced = 1 << 63
	// MaxWithdraw bounds the calls one fence covers: a lane holds at most a ring's slots
	// in its batch and a ring's slots published behind it.
	MaxWithdraw = 2 * Slots
)

// Enter is called by the lane before it starts the call of its own ring with sequence
// number seq (calls come in order). It returns false if the host has withdrawn the call:
// the lane must not run it.
func (g Gate) Enter(seq uint64) bool {
	for {
		v := g.w.Load()
		w, write, run := enter(v, seq)
		if !write || g.w.CompareAndSwap(v, w) || !run {
			return run
		}
	}
}

// enter is the lane's step for call seq from the word v: whether it runs the call, and the
// word it writes in place of v (when write). A call it skips needs no write, but for the
// last call of a fence, which lifts it: if that write loses, the host extended the fence,
// which the lane lifts later. A call it runs must win its write, or be decided again.
func enter(v, seq uint64) (w uint64, write, run bool) {
	if v&gateFenced != 0 {
		from, n := uint32(v), fencedCount(v)
		if d := uint32(seq) - from; d < n {
			return seq, d == n-1, false
		}
	}
	return seq, true, true
}

// Fence is called by the host to withdraw the calls after the last one the lane started, up
// to last, the last it published. It returns the first call of the fence: the calls from
// there to last are withdrawn, those of an earlier fence it extends included. ok is false if
// the lane started another call first, lifted or reached the end of an earlier fence, or has
// nothing new to withdraw.
func (g Gate) Fence(last uint64) (from uint64, ok bool) {
	v := g.w.Load()
	w, from, ok := fence(v, last)
	return from, ok && g.w.CompareAndSwap(v, w)
}

// fence is the host's step: the word that fences the calls after v up to last, and the first
// of them.
func fence(v, last uint64) (w, from uint64, ok bool) {
	if v&gateFenced == 0 {
		if last <= v || last-v > MaxWithdraw {
			return 0, 0, false
		}
		from = v + 1
	} else {
		// Extend an earlier fence that the lane is behind: its start in full from last,
		// which it is at most MaxWithdraw behind, and not before call 1 (the word is the
		// lane's: it may name anything).
		d := uint64(uint32(last) - uint32(v))
		if d+1 <= uint64(fencedCount(v)) || d >= MaxWithdraw || d >= last {
			return 0, 0, false
		}
		from = last - d
	}
	return gateFenced | (last-from+1)<<32 | uint64(uint32(from)), from, true
}

// fencedCount is how many calls the fenced word v covers.
func fencedCount(v uint64) uint32 { return uint32(v>>32) &^ (gateFenced >> 32) }

// Fenced reports whether withdrawn calls are still ahead of the lane.
func (g Gate) Fenced() bool { return g.w.Load()&gateFenced != 0 }
