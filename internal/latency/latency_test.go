package latency

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func TestBucketsAreContiguousAndTight(t *testing.T) {
	for i := 0; i < Buckets-1; i++ {
		lo, hi := lower(i), lower(i+1)
		if hi <= lo {
			t.Fatalf("bucket %d: [%d, %d)", i, lo, hi)
		}
		if index(lo) != i || index(hi-1) != i || index(hi) != i+1 {
			t.Fatalf("bucket %d [%d, %d): index(lo)=%d index(hi-1)=%d index(hi)=%d", i, lo, hi, index(lo), index(hi-1), index(hi))
		}
		if lo >= sub && float64(hi-lo)/float64(lo) > 1.0/sub {
			t.Fatalf("bucket %d [%d, %d) is wider than 1/%d of its lower bound", i, lo, hi, sub)
		}
	}
	if got := index(1 << 60); got != Buckets-1 {
		t.Errorf("index(2^60) = %d, want the last bucket %d", got, Buckets-1)
	}
	if got := index(^uint64(0)); got != Buckets-1 {
		t.Errorf("index(max) = %d", got)
	}
	if sz := unsafe.Sizeof(Histogram{}); sz != Bytes {
		t.Errorf("Histogram is %d bytes, Bytes says %d", sz, Bytes)
	}
}

// Quantiles of a known distribution come back within the buckets' precision.
func TestQuantilesMatchSortedValues(t *testing.T) {
	var h Histogram
	r := rand.New(rand.NewPCG(1, 2))
	vals := make([]time.Duration, 100_000)
	for i := range vals {
		// log-uniform between 100ns and 100ms
		vals[i] = time.Duration(100 * math.Pow(10, 6*r.Float64()))
		h.Record(vals[i])
	}
	slices.Sort(vals)
	s := h.Snapshot()
	if s.Count != uint64(len(vals)) || s.Max != vals[len(vals)-1] {
		t.Fatalf("count %d max %v, want %d %v", s.Count, s.Max, len(vals), vals[len(vals)-1])
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
		want := vals[max(int(q*float64(len(vals))+0.5), 1)-1]
		got := s.Quantile(q)
		if rel := float64(got-want) / float64(want); rel > 0.04 || rel < -0.04 {
			t.Errorf("p%v = %v, want %v (±4%%): off by %.1f%%", q*100, got, want, rel*100)
		}
	}
	if got := (&Snapshot{}).Quantile(0.5); got != 0 {
		t.Errorf("empty p50 = %v", got)
	}
}

func TestHugeAndNegativeValues(t *testing.T) {
	var h Histogram
	h.Record(-5)
	h.Record(100 * time.Hour)
	s := h.Snapshot()
	if s.Count != 2 || s.Quantile(0) != 0 || s.Quantile(1) != 100*time.Hour {
		t.Errorf("count %d p0 %v p100 %v", s.Count, s.Quantile(0), s.Quantile(1))
	}
}

// A window forgets what is older than the period before the current one.
func TestWindowForgetsOldPeriods(t *testing.T) {
	w := NewWindow(time.Second)
	w.Record(100*time.Millisecond, time.Millisecond)            // period 1
	w.Record(1100*time.Millisecond, 2*time.Millisecond)         // period 2
	if s := w.Snapshot(1500 * time.Millisecond); s.Count != 2 { // periods 1 and 2
		t.Fatalf("count %d, want 2", s.Count)
	}
	if s := w.Snapshot(2500 * time.Millisecond); s.Count != 1 || s.Max != 2*time.Millisecond { // periods 2 and 3
		t.Fatalf("count %d max %v, want the second value only", s.Count, s.Max)
	}
	w.Record(2100*time.Millisecond, 3*time.Millisecond) // period 3 empties period 1's histogram
	s := w.Snapshot(2200 * time.Millisecond)
	if s.Count != 2 || s.Max != 3*time.Millisecond || s.Quantile(0.5) > 2100*time.Microsecond {
		t.Fatalf("count %d max %v p50 %v", s.Count, s.Max, s.Quantile(0.5))
	}
	if s := w.Snapshot(10 * time.Second); s.Count != 0 {
		t.Fatalf("long after: count %d", s.Count)
	}
}

// Concurrent recorders lose nothing within a period.
func TestConcurrentRecord(t *testing.T) {
	w := NewWindow(time.Hour)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10_000 {
				w.Record(time.Minute, time.Duration(g*1000+i))
			}
		}()
	}
	wg.Wait()
	if s := w.Snapshot(time.Minute); s.Count != 80_000 || s.Max != 7000+9999 {
		t.Fatalf("count %d max %v", s.Count, s.Max)
	}
}

func TestRecordDoesNotAllocate(t *testing.T) {
	w := NewWindow(time.Second)
	if n := testing.AllocsPerRun(1000, func() { w.Record(time.Minute, time.Microsecond) }); n != 0 {
		t.Fatalf("%v allocs per Record", n)
	}
}

func BenchmarkRecord(b *testing.B) {
	w := NewWindow(time.Second)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w.Record(time.Since(start), 800*time.Nanosecond)
		}
	})
}

func TestNowIsMonotonic(t *testing.T) {
	a := Now()
	time.Sleep(time.Millisecond)
	if b := Now(); b-a < time.Millisecond {
		t.Errorf("Now moved %v over a 1ms sleep", b-a)
	}
}

func BenchmarkNow(b *testing.B) {
	for range b.N {
		_ = Now()
	}
}
