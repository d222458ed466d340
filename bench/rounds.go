//go:build linux

package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// A target compares two rows, but in the main pass those rows can run minutes
// apart, and this VM moves between speeds over such spans: the same row reads
// 250 ns or 850 ns from one run to the next (`BenchmarkDefault/goroutine/
// goroutines/lanes=2`, 12 runs in a row), and a channel pool beside it does
// the same (300 or 700 ns), so a ratio of two distant rows is often one row's
// fast mode against the other's slow one. After the main pass the harness
// therefore measures each target's two rows again, one right after the other,
// for -rounds rounds (the first row first in even rounds, second in odd ones),
// and judges the target by the median of the rounds' ratios. The table rows
// and the plots keep the main pass.
//
// Within a round the VM can still change speed between the two rows, a
// second apart: a round trip over loopback (a remote call, two processes and
// a gRPC connection each way) read 150 to 320 µs from one round to the next.
// With -interleave N a round-trip pair (one call in flight, no load) runs
// both rows' setups at once and alternates between them N times, each slice
// a testing.Benchmark of benchtime/N, and sums each row's slices: both rows
// then sample the same stretch of the VM's time.

// pairRound is one adjacent measurement of a target's two rows.
type pairRound struct {
	Row     string `json:"row"`
	Against string `json:"against"`
	A       result `json:"a"`
	B       result `json:"b"`
	// Slices is how many times the two rows took turns (-interleave); 0: one
	// after the other.
	Slices int `json:"slices,omitempty"`
}

// targetPairs lists, once each and in target order, the (row, against) pairs
// of the ratio targets whose rows were both measured.
func targetPairs(ts []targetResult) [][2]string {
	var pairs [][2]string
	for _, t := range ts {
		p := [2]string{t.Row, t.Against}
		if !paired(t) || slices.Contains(pairs, p) {
			continue
		}
		pairs = append(pairs, p)
	}
	return pairs
}

// paired reports whether t compares two rows that were both measured: the
// targets that paired rounds judge.
func paired(t targetResult) bool { return t.Against != "" && t.Status != "n/a" }

// measurePairs measures every pair rounds times, its two rows back to back.
// A pair whose scenario is unknown is skipped; a row that fails is kept with
// its error (applyRounds ignores that round).
func measurePairs(pairs [][2]string, all []scenario, rounds, interleave int, benchtime time.Duration, stderr io.Writer) []pairRound {
	byName := map[string]scenario{}
	for _, s := range all {
		byName[s.name] = s
	}
	var out []pairRound
	for k := range rounds {
		for _, p := range pairs {
			a, okA := byName[p[0]]
			b, okB := byName[p[1]]
			if !okA || !okB {
				continue
			}
			fmt.Fprintf(stderr, "round %d/%d: %s ÷ %s ", k+1, rounds, p[0], p[1])
			t0 := time.Now()
			pr := pairRound{Row: p[0], Against: p[1]}
			together := interleave > 0 && interleavable(a) && interleavable(b)
			if together {
				var err error
				if pr.A, pr.B, err = runInterleaved(a, b, k%2 == 1, interleave, benchtime); err != nil {
					fmt.Fprintf(stderr, "(the two rows cannot be set up together: %v; one after the other) ", err)
					together = false
				} else {
					pr.Slices = interleave
				}
			}
			switch {
			case together:
			case k%2 == 0:
				pr.A, pr.B = runScenario(a), runScenario(b)
			default:
				pr.B, pr.A = runScenario(b), runScenario(a)
			}
			fmt.Fprintf(stderr, "%v\n", time.Since(t0).Round(time.Millisecond))
			out = append(out, pr)
		}
	}
	return out
}

// applyRounds judges every ratio target that has paired rounds by them: its
// Value, AgainstValue and Ratio become the medians over the rounds (the ratio
// is the median of the rounds' own ratios, not a ratio of medians), and its
// Note gives the main pass's ratio and each round's.
func applyRounds(ts []targetResult, rounds []pairRound) {
	for i := range ts {
		t := &ts[i]
		if !paired(*t) {
			continue
		}
		var as, bs, ratios []float64
		for _, r := range rounds {
			if r.Row != t.Row || r.Against != t.Against || !measured(&r.A) || !measured(&r.B) {
				continue
			}
			a, b := figure(&r.A, t.Unit), figure(&r.B, t.Unit)
			if a <= 0 || b <= 0 {
				continue
			}
			as, bs, ratios = append(as, a), append(bs, b), append(ratios, a/b)
		}
		if len(ratios) == 0 {
			continue
		}
		each := make([]string, len(ratios))
		for k, x := range ratios {
			each[k] = fmt.Sprintf("%.3g", x)
		}
		note := fmt.Sprintf("median of %d paired rounds (%s); main pass %.3g", len(ratios), strings.Join(each, ", "), t.Ratio)
		if t.Note != "" {
			note += "; " + t.Note
		}
		t.Note = note
		t.Value, t.AgainstValue, t.Ratio = median(as), median(bs), median(ratios)
		t.Status = judge(t.Ratio, t.Op, t.Limit)
	}
}

// median of xs (not empty); the mean of the middle two for an even count.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// interleavable reports whether s may run interleaved with another row: a
// timed loop with one call in flight on an otherwise idle machine (a loaded
// row's setup starts busy loops, which two setups at once would double).
func interleavable(s scenario) bool {
	return s.setup != nil && s.measure == nil && s.inFlight == 1 && s.meta.Load == ""
}

// interleaveSettle is the pause before each slice: a process lane (and a knit
// node's lane, NodeConfig.LaneSpin) polls for up to a millisecond after its
// last call before it parks, and must not run beside the other row's slice.
const interleaveSettle = 5 * time.Millisecond

// runInterleaved sets a and b up together and measures them in turns, slices
// times each (b first in each turn when bFirst), each slice a testing.Benchmark
// of benchtime/slices; each row's result sums its slices. It returns an error,
// and no results, when the two cannot be set up together (two remote pools
// with different TLS settings share no process); then nothing is measured.
func runInterleaved(a, b scenario, bFirst bool, slices int, benchtime time.Duration) (ra, rb result, err error) {
	ra = result{Name: a.name, InFlight: a.inFlight, rowMeta: a.meta}
	rb = result{Name: b.name, InFlight: b.inFlight, rowMeta: b.meta}
	bodyA, cleanA, err := a.setup()
	if err != nil {
		return ra, rb, err
	}
	defer ra.cleanUp(cleanA)
	bodyB, cleanB, err := b.setup()
	if err != nil {
		return ra, rb, err
	}
	defer rb.cleanUp(cleanB)
	slice := max(benchtime/time.Duration(slices), time.Millisecond)
	if err := flag.Set("test.benchtime", slice.String()); err != nil {
		return ra, rb, err
	}
	defer func() { _ = flag.Set("test.benchtime", benchtime.String()) }()
	type side struct {
		body func(*testing.B)
		res  *result
		sum  testing.BenchmarkResult
	}
	sides := [2]*side{{body: bodyA, res: &ra}, {body: bodyB, res: &rb}}
	if bFirst {
		sides[0], sides[1] = sides[1], sides[0]
	}
	takeFailure()
	for range slices {
		for _, sd := range sides {
			runtime.GC()
			time.Sleep(interleaveSettle)
			br, err := benchmark(sd.body)
			if err != nil {
				sd.res.Err = err.Error()
				return ra, rb, nil
			}
			sd.sum.N += br.N
			sd.sum.T += br.T
			sd.sum.MemAllocs += br.MemAllocs
			sd.sum.MemBytes += br.MemBytes
		}
	}
	for _, sd := range sides {
		sd.res.fill(sd.sum)
	}
	return ra, rb, nil
}
