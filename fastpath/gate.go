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
// when it reaches the last call fenced. Only the lane writes a fenced word.
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
		if v&gateFenced != 0 {
			from, n := uint32(v), uint32(v>>32)&^(gateFenced>>32)
			if d := uint32(seq) - from; d < n {
				if d == n-1 { // the last call fenced: the lane is past the fence
					g.w.CompareAndSwap(v, seq)
				}
				return false
			}
		}
		if g.w.CompareAndSwap(v, seq) {
			return true
		}
	}
}

// Fence is called by the host to withdraw the calls after the last one the lane started, up
// to last, the last it published. It returns the first call withdrawn; ok is false if the
// lane started another call first, is not past an earlier fence yet, or has none to withdraw.
func (g Gate) Fence(last uint64) (from uint64, ok bool) {
	v := g.w.Load()
	if v&gateFenced != 0 || last <= v || last-v > MaxWithdraw {
		return 0, false
	}
	from = v + 1
	return from, g.w.CompareAndSwap(v, gateFenced|(last-v)<<32|uint64(uint32(from)))
}

// Fenced reports whether withdrawn calls are still ahead of the lane.
func (g Gate) Fenced() bool { return g.w.Load()&gateFenced != 0 }
