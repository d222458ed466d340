package fastpath

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestGateModel runs every interleaving of a lane entering calls 1..k (a load, then a CAS,
// retried) with a host that fences once (a load, then a CAS) at any point, and checks that
// each call either ran on the lane or was withdrawn, never both and never neither, and that
// the lane ends past the fence.
func TestGateModel(t *testing.T) {
	const k = 4
	type state struct {
		word             uint64
		seq              uint64 // the call the lane is entering (k+1: done)
		laneLoaded       bool
		laneV            uint64
		hostStep         int // 0: not yet, 1: loaded, 2: done
		hostV            uint64
		ran, withdrew    uint32 // bit per call
		fencedFrom, last uint64
	}
	runs := 0
	var explore func(s state)
	explore = func(s state) {
		if s.seq > k && s.hostStep == 2 {
			runs++
			if s.ran&s.withdrew != 0 || s.ran|s.withdrew != (1<<(k+1))-2 {
				t.Fatalf("ran %04b withdrew %04b (fence from %d to %d)", s.ran>>1, s.withdrew>>1, s.fencedFrom, s.last)
			}
			if s.word&gateFenced != 0 {
				t.Fatalf("the lane ended fenced: %#x", s.word)
			}
			return
		}
		if s.seq <= k { // the lane's next step
			n := s
			switch v := n.word; {
			case !n.laneLoaded && v&gateFenced != 0 && uint32(n.seq)-uint32(v) < uint32(v>>32)&^(gateFenced>>32):
				// Load saw the call fenced: skip it (lifting the fence at its last call,
				// a CAS nobody can beat, as only the lane writes a fenced word).
				if uint32(n.seq)-uint32(v) == uint32(v>>32)&^(gateFenced>>32)-1 {
					n.word = n.seq
				}
				n.seq++
			case !n.laneLoaded:
				n.laneLoaded, n.laneV = true, v
			case v == n.laneV: // the CAS wins: the call runs
				n.word = n.seq
				n.ran |= 1 << n.seq
				n.seq++
				n.laneLoaded = false
			default: // the CAS loses: load again
				n.laneLoaded = false
			}
			explore(n)
		}
		switch s.hostStep { // the host's next step
		case 0:
			n := s
			n.hostStep, n.hostV = 1, n.word
			explore(n)
		case 1:
			n := s
			n.hostStep = 2
			v, last := n.hostV, uint64(k) // every call is published
			if v&gateFenced == 0 && last > v && n.word == v {
				n.word = gateFenced | (last-v)<<32 | uint64(uint32(v+1))
				n.fencedFrom, n.last = v+1, last
				for c := v + 1; c <= last; c++ {
					n.withdrew |= 1 << c
				}
			}
			explore(n)
		}
	}
	explore(state{seq: 1})
	if runs == 0 {
		t.Fatal("no interleaving explored")
	}
	t.Logf("%d interleavings", runs)
}

// TestGateConcurrent has a lane goroutine enter calls as a host fences behind it, with the
// real code, and checks that each call ran or was withdrawn, exactly once.
func TestGateConcurrent(t *testing.T) {
	const n = 20000
	var w atomic.Uint64
	g := Gate{w: &w}
	var published atomic.Uint64
	ran := make([]bool, n+1)
	withdrawn := make([]bool, n+1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the host: publishes ahead of the lane and fences what it can
		defer wg.Done()
		for p := uint64(1); p <= n; p++ {
			published.Store(p)
			if p%3 == 0 {
				if from, ok := g.Fence(p); ok {
					for c := from; c <= p; c++ {
						withdrawn[c] = true
					}
				}
			}
		}
	}()
	for seq := uint64(1); seq <= n; seq++ {
		for published.Load() < seq {
			runtime.Gosched()
		}
		if g.Enter(seq) {
			ran[seq] = true
		}
	}
	wg.Wait()
	for c := 1; c <= n; c++ {
		if ran[c] == withdrawn[c] {
			t.Fatalf("call %d: ran %v, withdrawn %v", c, ran[c], withdrawn[c])
		}
	}
	if g.Fenced() {
		t.Fatal("the lane ended fenced")
	}
}
