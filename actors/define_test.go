package actors

import (
	"context"
	"fmt"
	"runtime"
	"testing"
)

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

var defineCostSeq int

// defineMany defines n fresh tasks that are never called and returns the live heap they
// added, per task.
func defineMany(n int) float64 {
	fn := func(_ context.Context, n int) (int, error) { return n, nil }
	before := liveHeap()
	for range n {
		defineCostSeq++
		Define(fmt.Sprintf("test.actors.define.%d", defineCostSeq), fn, Options{})
	}
	return (float64(liveHeap()) - float64(before)) / float64(n)
}

// maxDefineHeap bounds the heap an unused task keeps: its Task (name, codecs, the table's
// level pointers) and its registry entries. A pool of 100,000 tasks starts in every lane,
// so a task must cost bytes until it is called: a fixed table of 4,096 chunk pointers made
// it 41 KB.
const maxDefineHeap = 1024

// TestDefineCostsBytes: an unused task keeps at most maxDefineHeap bytes of heap.
func TestDefineCostsBytes(t *testing.T) {
	if per := defineMany(2000); per > maxDefineHeap {
		t.Fatalf("each Define keeps %.0f bytes of heap, want at most %d", per, maxDefineHeap)
	} else {
		t.Logf("each Define keeps %.0f bytes of heap", per)
	}
}

// TestTableGrowsOnUse: a table makes records only as calls need them, in levels that
// double, and every record it made is found again by its index.
func TestTableGrowsOnUse(t *testing.T) {
	task := defineTest(t, double, Options{})
	var recs []*Record[int, int]
	made := func() (levels int) {
		for k := range maxLevels {
			if lv := level(&task.Records, k); lv != nil {
				if len(lv) != firstLevel<<k {
					t.Fatalf("level %d holds %d records, want %d", k, len(lv), firstLevel<<k)
				}
				levels++
			}
		}
		return levels
	}
	if n := made(); n != 0 {
		t.Fatalf("an unused task has %d levels", n)
	}
	// 1 call: the first level; firstLevel+1 calls in flight: the second; and so on.
	for _, c := range []struct{ inFlight, levels int }{{1, 1}, {firstLevel, 1}, {firstLevel + 1, 2},
		{3 * firstLevel, 2}, {3*firstLevel + 1, 3}, {1000, 6}} {
		for len(recs) < c.inFlight {
			recs = append(recs, startCall(t, task, context.Background(), len(recs), 1, 0))
		}
		if got := made(); got != c.levels {
			t.Fatalf("%d calls in flight made %d levels, want %d", c.inFlight, got, c.levels)
		}
	}
	seen := map[*Record[int, int]]bool{}
	for i, r := range recs {
		if r.ID != uint32(i) || task.Records.Get(r.ID) != r || seen[r] {
			t.Fatalf("record %d (ID %d): Get gives %p, want %p, once", i, r.ID, task.Records.Get(r.ID), r)
		}
		seen[r] = true
	}
	for _, r := range recs {
		releaseCall(task, r)
	}
}

// level returns level k of table, nil if it is not made.
func level[In, Out any](table *Table[In, Out], k int) []Record[In, Out] {
	if k == 0 {
		if lv := table.first.Load(); lv != nil {
			return lv[:]
		}
		return nil
	}
	if lv := table.levels[k].Load(); lv != nil {
		return *lv
	}
	return nil
}

// BenchmarkDefine reports the heap an unused task keeps (live-B/task), with
// go test ./actors -run '^$' -bench BenchmarkDefine -benchtime=2000x.
func BenchmarkDefine(b *testing.B) {
	b.ReportMetric(defineMany(b.N), "live-B/task")
}
