//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// ============================================================================
// Work stealing vs private lanes (issue 13), both runtimes, stealLanes lanes:
//
//   - skewed workload (1 call in skewEvery sleeps skewSleep in its lane, the
//     rest return at once), at two loads:
//     "skewed, N callers" — skewCallers goroutines each making one Task.Call
//     after another, fewer than the lanes, so a free lane always exists and
//     only dispatch decides whether a fast call waits behind a slow one;
//     "skewed, 1024 goroutines calling" — saturated (runInFlight).
//     Each row reports, besides throughput, the p50 and p99 latency of the
//     FAST calls only (result.FastP50Ns, FastP99Ns): the slow calls' own
//     latency is the sleep and says nothing about dispatch.
//   - uniform workload (every call instant, knitInc): window 1024 and
//     sequential Call — what stealing costs where there is nothing to steal.
//
// Rows: stealing with each discipline (Steal: StealTicket, StealDekker, and on
// goroutine lanes StealLocal, their default), and
// private lanes (Steal: StealOff) with each Balancer. Every row name
// contains "steal" ("steal Ticket", "steal off, RoundRobin"), so
// `-filter steal` runs them alone. The targets are in stealTargets.
// ============================================================================

const (
	// stealLanes is the lane count of every stealing row: enough lanes for
	// a slow call to hold one while others are free, and the 4 lanes of the
	// issue's stress test.
	stealLanes = 4
	// skewCallers is the number of callers of the free-lane rows: fewer
	// than stealLanes, so at any moment at least one lane holds no call
	// (bench/README.md explains the choice).
	skewCallers = 3
	// skewEvery: the call whose input is a multiple of skewEvery is slow.
	skewEvery = 50
	// skewSleep is how long a slow call blocks its lane.
	skewSleep = time.Millisecond
)

// knitSkew is the task of the skewed rows: in+1, after blocking its lane
// for skewSleep when in is a multiple of skewEvery.
var knitSkew = knit.Define("bench.skew", func(_ context.Context, in uint64) (uint64, error) {
	if in%skewEvery == 0 {
		time.Sleep(skewSleep)
	}
	return in + 1, nil
})

// Workloads named in rowMeta.Workload.
const (
	workloadSkewed  = "skewed"
	workloadUniform = "uniform"
)

// shapeCallers: Window goroutines each make one blocking call after another,
// Window smaller than the lanes (a free lane always exists).
const shapeCallers = "callers"

// dispatch is how a stealing row's pool dispatches calls.
type dispatch struct {
	label    string // in the row name
	key      string // rowMeta.Dispatch
	steal    knit.Steal
	balancer knit.Balancer
	// goroutines: the dispatch exists for goroutine lanes only.
	goroutines bool
}

// Dispatch keys of the stealing rows.
const (
	dispatchTicket      = "steal-ticket"
	dispatchDekker      = "steal-dekker"
	dispatchLocal       = "steal-local"
	dispatchLeastLoaded = "private-least-loaded"
	dispatchRoundRobin  = "private-round-robin"
)

var (
	stealDispatches = []dispatch{
		{"steal Ticket", dispatchTicket, knit.StealTicket, knit.LeastLoaded, false},
		{"steal Dekker", dispatchDekker, knit.StealDekker, knit.LeastLoaded, false},
		{"steal Local", dispatchLocal, knit.StealLocal, knit.LeastLoaded, true},
	}
	privateDispatches = []dispatch{
		{"steal off, LeastLoaded", dispatchLeastLoaded, knit.StealOff, knit.LeastLoaded, false},
		{"steal off, RoundRobin", dispatchRoundRobin, knit.StealOff, knit.RoundRobin, false},
		{"steal off, FirstIdle", "private-first-idle", knit.StealOff, knit.FirstIdle, false},
		{"steal off, Random", "private-random", knit.StealOff, knit.Random, false},
		{"steal off, FirstIdleOrRandom", "private-first-idle-or-random", knit.StealOff, knit.FirstIdleOrRandom, false},
	}
)

func stealScenarios() []scenario {
	var rows []scenario
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		impl := implKnitGoroutine
		if rt == knit.Process {
			impl = implKnitProcess
		}
		for _, d := range slices.Concat(stealDispatches, privateDispatches) {
			if d.goroutines && rt != knit.Goroutine {
				continue
			}
			cfg := knit.Config{Lanes: stealLanes, Runtime: rt, Steal: d.steal, Balancer: d.balancer}
			prefix := fmt.Sprintf("knit %s, %d lanes, %s", rt, stealLanes, d.label)
			meta := func(workload, shape string, window int) rowMeta {
				return rowMeta{Impl: impl, Shape: shape, Lanes: stealLanes, Window: window, Workload: workload, Dispatch: d.key}
			}
			rows = append(rows,
				scenario{name: fmt.Sprintf("%s: skewed, %d callers", prefix, skewCallers), inFlight: skewCallers,
					meta:  meta(workloadSkewed, shapeCallers, skewCallers),
					setup: func() (func(*testing.B), func() error, error) { return setupKnitSkewCallers(cfg, skewCallers) }},
				scenario{name: fmt.Sprintf("%s: skewed, %d goroutines calling", prefix, inFlightTarget), inFlight: inFlightTarget,
					meta:  meta(workloadSkewed, shapeGoroutines, inFlightTarget),
					setup: func() (func(*testing.B), func() error, error) { return setupKnitSkewInFlight(cfg) }},
				scenario{name: fmt.Sprintf("%s: uniform, window %d", prefix, inFlightTarget), inFlight: inFlightTarget,
					meta:  meta(workloadUniform, shapeWindow, inFlightTarget),
					setup: func() (func(*testing.B), func() error, error) { return setupKnitWindow(cfg, inFlightTarget) }},
				scenario{name: prefix + ": uniform, sequential Call", inFlight: 1,
					meta:  meta(workloadUniform, shapeRoundTrip, 0),
					setup: func() (func(*testing.B), func() error, error) { return setupKnitRoundTrip(cfg) }},
			)
		}
	}
	return rows
}

// skewCall makes the next call of knitSkew (its input the next of seq) and, if it is a
// fast one, appends its latency to lat.
func skewCall(ctx context.Context, kp *knitPool, seq *atomic.Uint64, lat *[]int64) error {
	in := seq.Add(1)
	t0 := time.Now()
	got, err := knitSkew.Call(ctx, kp.Pool, in)
	d := time.Since(t0)
	if err != nil {
		return kp.failure(err)
	}
	if got != in+1 {
		return fmt.Errorf("knit: got %d, want %d", got, in+1)
	}
	if in%skewEvery != 0 {
		*lat = append(*lat, int64(d))
	}
	return nil
}

// setupKnitSkewCallers: callers goroutines share b.N calls of knitSkew,
// each making one Task.Call after another and timing the fast ones.
func setupKnitSkewCallers(cfg knit.Config, callers int) (func(*testing.B), func() error, error) {
	kp, err := newKnitPool(cfg, knitSkew)
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	var seq atomic.Uint64 // the input of the last call started
	body := func(b *testing.B) {
		var next atomic.Int64
		fast := make([][]int64, callers)
		var wg sync.WaitGroup
		for g := range callers {
			lat := make([]int64, 0, b.N/callers+1)
			wg.Go(func() {
				defer func() { fast[g] = lat }()
				for next.Add(1) <= int64(b.N) {
					if err := skewCall(ctx, kp, &seq, &lat); err != nil {
						fail(b, err)
						return
					}
				}
			})
		}
		wg.Wait()
		recordFastLatency(fast)
	}
	return body, kp.cleanup, nil
}

// setupKnitSkewInFlight: runInFlight goroutines each make one Task.Call of
// knitSkew after another, timing the fast ones.
func setupKnitSkewInFlight(cfg knit.Config) (func(*testing.B), func() error, error) {
	kp, err := newKnitPool(cfg, knitSkew)
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	var seq atomic.Uint64
	body := func(b *testing.B) {
		var mu sync.Mutex
		var fast [][]int64
		runInFlight(b, func(pb *testing.PB) {
			var lat []int64
			defer func() {
				mu.Lock()
				fast = append(fast, lat)
				mu.Unlock()
			}()
			for pb.Next() {
				if err := skewCall(ctx, kp, &seq, &lat); err != nil {
					fail(b, err)
					return
				}
			}
		})
		recordFastLatency(fast)
	}
	return body, kp.cleanup, nil
}

// fastLatency holds the fast-call percentiles of the last run of a skewed
// row's body (testing.Benchmark runs it with growing b.N; the last run is
// the one it reports).
var fastLatency struct {
	sync.Mutex
	p50, p99 float64
	n        int
	set      bool
}

// recordFastLatency computes the p50 and p99 (nearest rank) of the samples
// (ns) and keeps them for runScenario.
func recordFastLatency(samples [][]int64) {
	all := slices.Concat(samples...)
	slices.Sort(all)
	fastLatency.Lock()
	defer fastLatency.Unlock()
	fastLatency.p50, fastLatency.p99 = percentile(all, 0.50), percentile(all, 0.99)
	fastLatency.n, fastLatency.set = len(all), true
}

// takeFastLatency returns what recordFastLatency kept, and forgets it.
func takeFastLatency() (p50, p99 float64, n int, ok bool) {
	fastLatency.Lock()
	defer fastLatency.Unlock()
	p50, p99, n, ok = fastLatency.p50, fastLatency.p99, fastLatency.n, fastLatency.set
	fastLatency.p50, fastLatency.p99, fastLatency.n, fastLatency.set = 0, 0, 0, false
	return p50, p99, n, ok
}

// percentile is the nearest-rank p-quantile of sorted (0 for no samples).
func percentile(sorted []int64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p*float64(len(sorted)))) - 1
	k = max(0, min(k, len(sorted)-1))
	return float64(sorted[k])
}

// stealTargets are issue 13's goals, per runtime and steal discipline:
//
//   - with a free lane (skewed, skewCallers callers), the fast calls' p99
//     with stealing at most 0.2× (5× lower than) private lanes with the
//     default balancer (LeastLoaded) and with RoundRobin, reported apart;
//   - on the uniform workload (window 1024, and sequential Call as
//     calls/s), stealing's throughput at least 0.9× the best private
//     balancer's (stealing costs at most 10%).
func stealTargets(rs rowSet) []targetResult {
	var ts []targetResult
	for _, impl := range []string{implKnitProcess, implKnitGoroutine} {
		rt := strings.TrimPrefix(impl, "knit-")
		for _, d := range stealDispatches {
			if d.goroutines && impl != implKnitGoroutine {
				continue
			}
			steal := func(workload, shape string, window int) *result {
				return rs.findDispatch(impl, shape, stealLanes, window, workload, d.key)
			}
			name := func(label, what string) string {
				return fmt.Sprintf("knit %s, %d lanes, %s: %s", rt, stealLanes, label, what)
			}
			skewed := fmt.Sprintf("skewed, %d callers", skewCallers)
			for _, p := range privateDispatches[:2] { // LeastLoaded (the default), RoundRobin
				ts = append(ts, ratioTarget(
					fmt.Sprintf("%s lanes, free lane (%s): fast-call p99, %s ÷ %s", rt, skewed, d.label, p.label),
					steal(workloadSkewed, shapeCallers, skewCallers),
					rs.findDispatch(impl, shapeCallers, stealLanes, skewCallers, workloadSkewed, p.key),
					unitFastP99, "<=", 0.2, name(d.label, skewed), name(p.label, skewed)))
			}
			for _, u := range []struct {
				what   string
				shape  string
				window int
			}{
				{fmt.Sprintf("uniform, window %d", inFlightTarget), shapeWindow, inFlightTarget},
				{"uniform, sequential Call", shapeRoundTrip, 0},
			} {
				desc := fmt.Sprintf("%s lanes, %s: %s ÷ best private balancer (throughput)", rt, u.what, d.label)
				best, absent := bestPrivate(rs, impl, u.shape, u.window)
				if len(absent) > 0 {
					ts = append(ts, targetResult{Target: desc, Unit: unitCallsPerSec, Op: ">=", Limit: 0.9, Status: "n/a",
						Note: fmt.Sprintf("not measured: knit %s, %d lanes, %s: %s", rt, stealLanes, strings.Join(absent, "; "), u.what)})
					continue
				}
				t := ratioTarget(desc, steal(workloadUniform, u.shape, u.window), best,
					unitCallsPerSec, ">=", 0.9, name(d.label, u.what), best.Name)
				if t.Status != "n/a" {
					t.Note = "best private: " + best.Name
				}
				ts = append(ts, t)
			}
		}
	}
	return ts
}

// bestPrivate is the private-lanes row of this uniform shape with the
// highest throughput, and the rows that were not measured (then best is
// nil: the best of a subset is not the best balancer).
func bestPrivate(rs rowSet, impl, shape string, window int) (best *result, absent []string) {
	for _, p := range privateDispatches {
		r := rs.findDispatch(impl, shape, stealLanes, window, workloadUniform, p.key)
		if r == nil {
			absent = append(absent, p.label)
			continue
		}
		if best == nil || r.CallsPerSec > best.CallsPerSec {
			best = r
		}
	}
	if len(absent) > 0 {
		return nil, absent
	}
	return best, nil
}

// writeFastLatency prints the fast-call latency of the skewed rows, if any
// was measured.
func writeFastLatency(w io.Writer, results []result) {
	var rows []result
	for _, r := range results {
		if r.Workload == workloadSkewed && measured(&r) {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nSkewed rows (1 call in %d sleeps %v in its lane): latency of the fast calls only, and throughput of all calls:\n\n", skewEvery, skewSleep)
	fmt.Fprintln(w, "| scenario | fast p50 | fast p99 | fast calls | calls/s |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %d | %s |\n", r.Name, fmtLatency(r.FastP50Ns), fmtLatency(r.FastP99Ns), r.FastCalls, fmtSI(r.CallsPerSec))
	}
}
