package fastpath

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestGateModel runs every interleaving of a lane entering calls 1..k as they are published
// (enter's decision on a load, then its CAS, retried) with a host that fences twice (a load,
// then a CAS, with fence's decision): first over calls 1..k-1, then, after publishing call
// k, again — a fresh fence or an extension of the first. It checks that each call either ran
// on the lane or was withdrawn (the host moves the calls of a fence it has not moved yet),
// never both and never neither, and that the lane ends past every fence; and that the
// check fails for three mutants of the decisions.
func TestGateModel(t *testing.T) {
	runs, extensions, err := gateModel(enter, fence)
	if err != nil {
		t.Fatal(err)
	}
	if runs == 0 || extensions == 0 {
		t.Fatalf("%d interleavings, %d with an extended fence", runs, extensions)
	}
	t.Logf("%d interleavings, %d with an extended fence", runs, extensions)

	mutants := map[string]struct {
		enter func(v, seq uint64) (uint64, bool, bool)
		fence func(v, last uint64) (uint64, uint64, bool)
	}{
		"the lane runs the last call of a fence": {enter: func(v, seq uint64) (uint64, bool, bool) {
			w, write, run := enter(v, seq)
			return w, write, run || write
		}, fence: fence},
		"an extension starts a call late": {enter: enter, fence: func(v, last uint64) (uint64, uint64, bool) {
			if v&gateFenced == 0 {
				return fence(v, last)
			}
			w, from, ok := fence(v, last)
			return w + 1, from + 1, ok
		}},
		"no extension": {enter: enter, fence: func(v, last uint64) (uint64, uint64, bool) {
			if v&gateFenced != 0 {
				return 0, 0, false
			}
			return fence(v, last)
		}},
	}
	for name, m := range mutants {
		if _, ext, err := gateModel(m.enter, m.fence); err == nil && ext > 0 {
			t.Errorf("mutant %q passed the model", name)
		}
	}
}

// gateModel explores TestGateModel's interleavings with the given decisions; it returns how
// many it ran, how many extended a fence, and the first violation.
func gateModel(enter func(v, seq uint64) (uint64, bool, bool), fence func(v, last uint64) (uint64, uint64, bool)) (runs, extensions int, err error) {
	const k = 4
	type state struct {
		word          uint64
		seq           uint64 // the call the lane is entering (k+1: done)
		published     uint64
		laneLoaded    bool
		laneV         uint64
		hostStep      int // 0 load, 1 CAS (fence 1); 2 publish k; 3 load, 4 CAS (fence 2); 5 done
		hostV         uint64
		ran, withdrew uint32 // bit per call
		extended      bool
	}
	var explore func(s state)
	explore = func(s state) {
		if err != nil {
			return
		}
		if s.seq > k && s.hostStep == 5 {
			runs++
			if s.extended {
				extensions++
			}
			if s.ran&s.withdrew != 0 || s.ran|s.withdrew != (1<<(k+1))-2 {
				err = fmt.Errorf("ran %04b withdrew %04b", s.ran>>1, s.withdrew>>1)
			} else if s.word&gateFenced != 0 {
				err = fmt.Errorf("the lane ended fenced: %#x", s.word)
			}
			return
		}
		if s.seq <= s.published { // the lane's next step
			n := s
			if !n.laneLoaded {
				n.laneLoaded, n.laneV = true, n.word
			} else {
				w, write, run := enter(n.laneV, n.seq)
				switch {
				case write && n.word == n.laneV: // the CAS wins
					n.word = w
					fallthrough
				case !write || !run: // a skip: decided whatever the CAS did
					if run {
						n.ran |= 1 << n.seq
					}
					n.seq++
				}
				n.laneLoaded = false // a lost CAS of a call to run: load again
			}
			explore(n)
		}
		n := s // the host's next step
		switch s.hostStep {
		case 0, 3:
			n.hostV = n.word
		case 1, 4:
			if w, from, ok := fence(n.hostV, n.published); ok && n.word == n.hostV {
				n.extended = n.extended || n.hostV&gateFenced != 0
				n.word = w
				for c := from; c <= n.published; c++ {
					n.withdrew |= 1 << c
				}
			}
		case 2:
			n.published = k
		case 5:
			return
		}
		n.hostStep++
		explore(n)
	}
	explore(state{seq: 1, published: k - 1})
	return runs, extensions, err
}

// A fenced word the lane wrote that names calls the host never published, or more than
// MaxWithdraw of them, is refused: the host withdraws nothing on its say-so.
func TestGateRefusesAHostileFence(t *testing.T) {
	fenced := func(from uint64, n uint32) uint64 { return gateFenced | uint64(n)<<32 | uint64(uint32(from)) }
	for _, c := range []struct {
		name string
		v    uint64
		last uint64
	}{
		{"a fence that starts past the last call", fenced(9, 1), 5},
		{"a fence that starts before call 1", fenced(1<<32-3, 1), 5},
		{"a fence that already covers the last call", fenced(3, 3), 5},
		{"a fence more than MaxWithdraw calls back", fenced(100, 1), 100 + MaxWithdraw},
		{"a word past the last call", 7, 5},
	} {
		if _, from, ok := fence(c.v, c.last); ok {
			t.Errorf("%s: fenced from %d", c.name, from)
		}
	}
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
