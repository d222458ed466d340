// Package latency is the fixed-bucket log-linear histogram behind knit's per-task latency
// quantiles. Recording a value is one atomic add into its bucket (and a compare-and-swap when
// it is a new maximum): no lock, no allocation, so that it can sit on every call's path. A
// Window keeps two histograms that take turns, so that quantiles describe the last one to two
// periods rather than the whole life of a pool.
//
// Buckets: values below 16 ns have a bucket each; above, every power of two is split into 16
// buckets, so a bucket is at most 1/16 of its lower bound wide and a quantile read from its
// midpoint is within ±3.2 % of the true value. Values from 2^42 ns (73 minutes) up share the
// last bucket. A Histogram is Buckets 4-byte counters and a maximum: 2,504 bytes.
//
// It must never take a lock or allocate in Record, and never trust a value to be in range.
package latency

import (
	"math/bits"
	"runtime"
	"sync/atomic"
	"time"
)

const (
	subBits = 4 // 16 buckets per power of two
	sub     = 1 << subBits
	maxBits = 42 // values from 2^42 ns up count in the last bucket
	// Buckets is the number of buckets of a Histogram.
	Buckets = (maxBits - subBits + 1) * sub
	// Bytes is the memory of one Histogram.
	Bytes = Buckets*4 + 8
)

// index is the bucket of v nanoseconds.
func index(v uint64) int {
	if v < sub {
		return int(v)
	}
	e := bits.Len64(v) - 1 // v is in [2^e, 2^(e+1)), e >= subBits
	if e >= maxBits {
		return Buckets - 1
	}
	return (e-subBits+1)*sub + int((v>>(e-subBits))&(sub-1))
}

// lower is the smallest value of bucket i; upper(i) is lower(i+1).
func lower(i int) uint64 {
	if i < sub {
		return uint64(i)
	}
	e := i/sub + subBits - 1
	return uint64(sub+i%sub) << (e - subBits)
}

// Histogram counts durations in log-linear buckets. The zero value is empty and ready.
type Histogram struct {
	counts [Buckets]atomic.Uint32
	max    atomic.Uint64
}

// Record counts d; a negative d counts as zero.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[index(v)].Add(1)
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			return
		}
	}
}

// reset empties h. Values recorded while it runs may be lost or kept.
func (h *Histogram) reset() {
	for i := range h.counts {
		h.counts[i].Store(0)
	}
	h.max.Store(0)
}

// addTo adds h's counts to s.
func (h *Histogram) addTo(s *Snapshot) {
	for i := range h.counts {
		if n := h.counts[i].Load(); n != 0 {
			s.counts[i] += uint64(n)
			s.Count += uint64(n)
		}
	}
	s.Max = max(s.Max, time.Duration(h.max.Load()))
}

// Snapshot is a copy of the counts of one or more histograms.
type Snapshot struct {
	counts [Buckets]uint64
	Count  uint64        // values counted
	Max    time.Duration // the largest value counted (exact)
}

// Snapshot copies h.
func (h *Histogram) Snapshot() *Snapshot {
	s := new(Snapshot)
	h.addTo(s)
	return s
}

// Quantile is the value below which a fraction q of the values lie (nearest rank), as the
// midpoint of its bucket, never above Max; 0 when nothing was counted.
func (s *Snapshot) Quantile(q float64) time.Duration {
	if s.Count == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := uint64(q*float64(s.Count) + 0.5)
	rank = min(max(rank, 1), s.Count)
	var seen uint64
	for i, n := range s.counts {
		seen += n
		if seen < rank {
			continue
		}
		if i == Buckets-1 {
			return s.Max
		}
		lo, hi := lower(i), lower(i+1)
		return min(time.Duration(lo+(hi-lo)/2), s.Max)
	}
	return s.Max
}

// Window is a histogram of the last one to two periods: two histograms take turns, the one
// for the current period is emptied when the period starts (by the first Record in it).
// The zero value is not ready: use NewWindow. A Window is 2·Bytes plus 32 bytes.
type Window struct {
	period int64 // nanoseconds
	sets   [2]struct {
		epoch atomic.Int64 // the period number the histogram counts, 0 for none yet
		h     Histogram
	}
}

// NewWindow returns a Window of periods of p (at least a millisecond).
func NewWindow(p time.Duration) *Window {
	return &Window{period: int64(max(p, time.Millisecond))}
}

// Period is the window's period.
func (w *Window) Period() time.Duration { return time.Duration(w.period) }

// Record counts d, at time now (a monotonic clock reading in nanoseconds, such as the time
// since a fixed start: time.Since(start)).
func (w *Window) Record(now time.Duration, d time.Duration) {
	e := int64(now)/w.period + 1
	s := &w.sets[e&1]
	for {
		old := s.epoch.Load()
		switch {
		case old == e:
		case old == -e: // another recorder is emptying it for this period: a few hundred ns
			runtime.Gosched()
			continue
		case old > e || -old > e:
			// This recorder read the clock long ago (it was descheduled): it counts in the
			// newer period.
		case s.epoch.CompareAndSwap(old, -e):
			// The first Record of a new period empties the histogram of the period before
			// last; the others wait for it (negative: being emptied).
			s.h.reset()
			s.epoch.Store(e)
		default:
			continue
		}
		s.h.Record(d)
		return
	}
}

// Snapshot merges the histograms of the period that holds now and the one before it.
func (w *Window) Snapshot(now time.Duration) *Snapshot {
	e := int64(now)/w.period + 1
	s := new(Snapshot)
	for i := range w.sets {
		set := &w.sets[i]
		if ep := set.epoch.Load(); ep == e || ep == e-1 {
			set.h.addTo(s)
		}
	}
	return s
}
