package knit

import (
	"testing"
	"time"
)

// A task's pace rises fast and falls slowly: one call in 50 that sleeps a millisecond keeps
// its calls spread (the others queued behind it would wait for it), while a task whose calls
// are all quick is tiny.
func TestNotePace(t *testing.T) {
	p := &Pool{pace: make([]pace, 2)}
	quick, skewed := uint32(0), uint32(1)
	for range 20 {
		for i := range 50 {
			p.notePace(quick, uint64(100+i)) // 100 to 149 ns
			ran := 100 * time.Nanosecond
			if i == 0 {
				ran = time.Millisecond
			}
			p.notePace(skewed, uint64(ran))
			if n := spinnerFor(p.pace[skewed].ns.Load()); n != 0 && i > 0 {
				t.Fatalf("after a call of 1ms and %d of 100ns, the skewed task's pace %v lets a spinning lane hold %d calls",
					i, time.Duration(p.pace[skewed].ns.Load()), n)
			}
		}
	}
	if got := time.Duration(p.pace[quick].ns.Load()); got < 100*time.Nanosecond || got >= 150*time.Nanosecond {
		t.Errorf("the quick task's pace is %v, want its calls' 100 to 149ns", got)
	}
	if n := spinnerFor(p.pace[quick].ns.Load()); n != spinnerShare {
		t.Errorf("a spinning lane holds %d calls of the quick task, want %d", n, spinnerShare)
	}
	p.notePace(7, 100) // an index out of range is ignored
	p.notePace(quick, 0)
}

// A Map's chunk keeps the pace of its elements.
func TestNotePaceOfMapChunks(t *testing.T) {
	p := &Pool{pace: make([]pace, 1)}
	p.pace[0].per = twinChunk
	p.notePace(0, uint64(twinChunk*100))
	if got := p.pace[0].ns.Load(); got != 100 {
		t.Errorf("a chunk of %d elements that ran %dns has a pace of %dns, want 100", twinChunk, twinChunk*100, got)
	}
}
