//go:build linux

package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// targetResult is one line of the targets table: issue 9's goals, each a
// ratio of two rows of the same run (or one figure against a bound).
type targetResult struct {
	// Target describes the goal.
	Target string `json:"target"`
	// Row and Value are the figure being judged; Against and AgainstValue
	// the row it is compared with ("" for a bound on a single figure).
	Row          string  `json:"row,omitempty"`
	Value        float64 `json:"value"`
	Against      string  `json:"against,omitempty"`
	AgainstValue float64 `json:"against_value,omitempty"`
	// Unit is the unit of Value and AgainstValue: unitNs, unitCallsPerSec,
	// unitPercent or unitAllocs.
	Unit string `json:"unit"`
	// Ratio is Value ÷ AgainstValue (0 without Against).
	Ratio float64 `json:"ratio,omitempty"`
	// Op and Limit state the goal: Ratio (or Value, without Against) Op
	// Limit.
	Op    string  `json:"op"`
	Limit float64 `json:"limit"`
	// Status is PASS, FAIL, or n/a when a row was not measured (filtered
	// out, skipped or failed).
	Status string `json:"status"`
	Note   string `json:"note,omitempty"`
}

// Units of targetResult.Unit.
const (
	unitNs          = "ns/op"
	unitCallsPerSec = "calls/s"
	unitPercent     = "% of a core"
	unitAllocs      = "allocs/op"
	unitFastP99     = "fast-call p99 ns"
)

// allocsNoise is the allocs/op under which a knit row counts as
// allocation-free: allocs/op counts the whole host process, so the harness's
// stall watchdog (a Stats snapshot a second) and the Go runtime's own
// background work add a few allocations per run that are not the calls'.
const allocsNoise = 0.01

// rowSet looks rows up by their rowMeta.
type rowSet []result

// find returns the first measured row with this meta and the default
// dispatch and workload (not a stealing row), or nil.
func (rs rowSet) find(impl, shape string, lanes, window int) *result {
	return rs.findDispatch(impl, shape, lanes, window, "", "")
}

// findLoad is find for the rows run under a load (load.go; "": idle).
func (rs rowSet) findLoad(impl, shape string, lanes, window int, load string) *result {
	for i := range rs {
		r := &rs[i]
		if r.Impl == impl && r.Shape == shape && r.Lanes == lanes && r.Window == window &&
			r.Workload == "" && r.Dispatch == "" && r.Load == load && measured(r) {
			return r
		}
	}
	return nil
}

// findDispatch is find for the stealing rows: the first measured row with
// this meta, workload and dispatch, or nil.
func (rs rowSet) findDispatch(impl, shape string, lanes, window int, workload, dispatch string) *result {
	for i := range rs {
		r := &rs[i]
		if r.Impl == impl && r.Shape == shape && r.Lanes == lanes && r.Window == window &&
			r.Workload == workload && r.Dispatch == dispatch && r.Load == "" && measured(r) {
			return r
		}
	}
	return nil
}

// measured reports whether r has a figure: a timed row with ns/op, or an
// idle row with its CPU time.
func measured(r *result) bool {
	return r.Err == "" && r.Skipped == "" && (r.NsPerOp > 0 || r.Idle != nil)
}

// series returns, for each x in xs, the measured row with that lane count
// (byLanes) or window, or nil.
func (rs rowSet) series(impl, shape string, lanes, window int, byLanes bool, xs []int) []*result {
	out := make([]*result, len(xs))
	for i, x := range xs {
		if byLanes {
			out[i] = rs.find(impl, shape, x, window)
		} else {
			out[i] = rs.find(impl, shape, lanes, x)
		}
	}
	return out
}

// computeTargets evaluates every target of issue 9 on results (one run).
func computeTargets(results []result) []targetResult {
	rs := rowSet(results)
	procSeq := rs.find(implKnitProcess, shapeRoundTrip, 1, 0)
	goSeq := rs.find(implKnitGoroutine, shapeRoundTrip, 1, 0)
	var ts []targetResult

	latency := func(desc string, a, b *result, op string, limit float64, aName, bName string) {
		ts = append(ts, ratioTarget(desc, a, b, unitNs, op, limit, aName, bName))
	}
	throughput := func(desc string, a, b *result, op string, limit float64, aName, bName string) {
		ts = append(ts, ratioTarget(desc, a, b, unitCallsPerSec, op, limit, aName, bName))
	}

	latency("process lane sequential Call ÷ unix-socket child round trip",
		procSeq, rs.find(implUnixSocket, shapeRoundTrip, 1, 0), "<=", 0.1,
		"knit process, 1 lane: sequential Call", "unix socket child: round trip")
	latency("process lane sequential Call ÷ shm spin child round trip",
		procSeq, rs.find(implShmSpin, shapeRoundTrip, 1, 0), "<=", 3,
		"knit process, 1 lane: sequential Call", "shm spin child: round trip")
	throughput(fmt.Sprintf("process lanes, window %d, %d lanes ÷ unix-socket child pipelined (throughput; aim 2×)", inFlightTarget, poolWorkers),
		rs.find(implKnitProcess, shapeWindow, poolWorkers, inFlightTarget), rs.find(implUnixSocket, shapePipelined, 1, inFlightTarget), ">=", 1,
		"knit process, 2 lanes: window 1024", "unix socket child: pipelined")
	throughput(fmt.Sprintf("%d goroutines calling, %d process lanes ÷ channel pool of %d, same shape (throughput)", inFlightTarget, poolWorkers, poolWorkers),
		rs.find(implKnitProcess, shapeGoroutines, poolWorkers, inFlightTarget), rs.find(implChanPool, shapeGoroutines, poolWorkers, inFlightTarget), ">=", 0.5,
		"knit process, 2 lanes: 1024 goroutines calling", "chan: pool of 2 workers, 1024 in flight")
	latency("goroutine lane sequential Call ÷ unbuffered channel round trip",
		goSeq, rs.find(implChanUnbuffered, shapeRoundTrip, 1, 0), "<=", 1.25,
		"knit goroutine, 1 lane: sequential Call", "chan: unbuffered round trip")
	throughput(fmt.Sprintf("goroutine lanes, window %d, %d lanes ÷ channel pool of %d, same shape (throughput)", inFlightTarget, poolWorkers, poolWorkers),
		rs.find(implKnitGoroutine, shapeWindow, poolWorkers, inFlightTarget), rs.find(implChanPool, shapeWindow, poolWorkers, inFlightTarget), ">=", 1,
		"knit goroutine, 2 lanes: window 1024", "chan: pool of 2 workers, window 1024")
	throughput(fmt.Sprintf("%d goroutines calling, %d goroutine lanes ÷ channel pool of %d, same shape (throughput)", inFlightTarget, poolWorkers, poolWorkers),
		rs.find(implKnitGoroutine, shapeGoroutines, poolWorkers, inFlightTarget), rs.find(implChanPool, shapeGoroutines, poolWorkers, inFlightTarget), ">=", 1,
		"knit goroutine, 2 lanes: 1024 goroutines calling", "chan: pool of 2 workers, 1024 in flight")

	for _, impl := range []string{implKnitProcess, implKnitGoroutine} {
		ts = append(ts, collapseTarget(rs, impl))
	}
	for _, impl := range []string{implKnitProcess, implKnitGoroutine} {
		name := strings.TrimPrefix(impl, "knit-")
		latency(fmt.Sprintf("%s lanes sequential Call: 4 lanes ÷ 1 lane", name),
			rs.find(impl, shapeRoundTrip, 4, 0), rs.find(impl, shapeRoundTrip, 1, 0), "<=", 1.5,
			fmt.Sprintf("knit %s, 4 lanes: sequential Call", name), fmt.Sprintf("knit %s, 1 lane: sequential Call", name))
	}
	ts = append(ts, idleTarget(rs.find(implKnitProcess, shapeIdle, knitIdleLanes, 0)))
	ts = append(ts, allocsTarget(rs, shapeRoundTrip), allocsTarget(rs, shapeGoroutines))
	ts = append(ts, stealTargets(rs)...)
	ts = append(ts, loadTargets(rs)...)
	ts = append(ts, remoteTargets(rs)...)
	return ts
}

// ratioTarget compares a with b in unit: ns/op for latency, calls/s for
// throughput. aName and bName label missing rows.
func ratioTarget(desc string, a, b *result, unit, op string, limit float64, aName, bName string) targetResult {
	t := targetResult{Target: desc, Unit: unit, Op: op, Limit: limit, Row: aName, Against: bName}
	if a == nil || b == nil {
		t.Status = "n/a"
		t.Note = "not measured: " + missing(a, aName, b, bName)
		return t
	}
	t.Row, t.Against = a.Name, b.Name
	t.Value, t.AgainstValue = figure(a, unit), figure(b, unit)
	t.Ratio = t.Value / t.AgainstValue
	t.Status = judge(t.Ratio, op, limit)
	return t
}

func figure(r *result, unit string) float64 {
	switch unit {
	case unitCallsPerSec:
		return r.CallsPerSec
	case unitFastP99:
		return r.FastP99Ns
	}
	return r.NsPerOp
}

func missing(a *result, aName string, b *result, bName string) string {
	var m []string
	if a == nil {
		m = append(m, aName)
	}
	if b == nil {
		m = append(m, bName)
	}
	return strings.Join(m, ", ")
}

// collapseTarget: in the lanes sweep (window inFlightTarget), the worst lane
// count's throughput ÷ the best's must be ≥ 0.67.
func collapseTarget(rs rowSet, impl string) targetResult {
	name := strings.TrimPrefix(impl, "knit-")
	t := targetResult{Target: fmt.Sprintf("%s lanes sweep, window %d: worst ÷ best lane count (throughput)", name, inFlightTarget),
		Unit: unitCallsPerSec, Op: ">=", Limit: 0.67}
	var worst, best *result
	var absent []string
	for i, r := range rs.series(impl, shapeWindow, 0, inFlightTarget, true, laneSweep) {
		if r == nil {
			absent = append(absent, fmt.Sprintf("%d lanes", laneSweep[i]))
			continue
		}
		if worst == nil || r.CallsPerSec < worst.CallsPerSec {
			worst = r
		}
		if best == nil || r.CallsPerSec > best.CallsPerSec {
			best = r
		}
	}
	if len(absent) > 0 {
		t.Status = "n/a"
		t.Note = fmt.Sprintf("not measured: knit %s window %d with %s", name, inFlightTarget, strings.Join(absent, ", "))
		return t
	}
	t.Row, t.Value = worst.Name, worst.CallsPerSec
	t.Against, t.AgainstValue = best.Name, best.CallsPerSec
	t.Ratio = t.Value / t.AgainstValue
	t.Status = judge(t.Ratio, t.Op, t.Limit)
	t.Note = fmt.Sprintf("worst: %s lanes, best: %s lanes", laneLabel(worst), laneLabel(best))
	return t
}

func laneLabel(r *result) string { return strconv.Itoa(r.Lanes) }

// idleTarget: an idle pool of 4 process lanes uses under 1% of one core.
func idleTarget(r *result) targetResult {
	t := targetResult{Target: fmt.Sprintf("idle pool of %d process lanes: CPU of host, lanes and spares", knitIdleLanes),
		Unit: unitPercent, Op: "<", Limit: 1}
	if r == nil {
		t.Status, t.Note = "n/a", fmt.Sprintf("not measured: knit process, %d lanes: idle CPU", knitIdleLanes)
		return t
	}
	t.Row, t.Value = r.Name, r.Idle.CPUPercent
	t.Status = judge(t.Value, t.Op, t.Limit)
	t.Note = fmt.Sprintf("over %v, from %s; host %.2f%%, lanes and spares %.2f%%",
		fmtWindow(r.Idle.WindowNs), r.Idle.Source, r.Idle.HostPercent, r.Idle.LanesPercent)
	return t
}

// allocsTarget: knit's Call allocates nothing. The figure is the largest
// allocs/op among the measured knit rows of shape (sequential Call, or
// 1024 goroutines calling) — the shapes that use Task.Call; Task.Go's
// Future is an allocation by design.
func allocsTarget(rs rowSet, shape string) targetResult {
	what := "sequential Call rows"
	if shape == shapeGoroutines {
		what = fmt.Sprintf("%d goroutines calling rows", inFlightTarget)
	}
	t := targetResult{Target: "knit allocs per Call, largest over the " + what,
		Unit: unitAllocs, Op: "<", Limit: allocsNoise, Note: fmt.Sprintf("0 wanted; below %g counts as the harness's own background", allocsNoise)}
	var worst *result
	for i := range rs {
		r := &rs[i]
		if (r.Impl == implKnitProcess || r.Impl == implKnitGoroutine) && r.Shape == shape && r.Dispatch == "" && r.Load == "" && measured(r) {
			if worst == nil || r.AllocsPerOp > worst.AllocsPerOp {
				worst = r
			}
		}
	}
	if worst == nil {
		t.Status, t.Note = "n/a", "not measured: no knit "+what
		return t
	}
	t.Row, t.Value = worst.Name, worst.AllocsPerOp
	t.Status = judge(t.Value, t.Op, t.Limit)
	t.Note = fmt.Sprintf("%s; 0 wanted, below %g counts as the harness's own background", worst.Name, allocsNoise)
	return t
}

func judge(v float64, op string, limit float64) string {
	ok := false
	switch op {
	case "<=":
		ok = v <= limit
	case ">=":
		ok = v >= limit
	case "<":
		ok = v < limit
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		ok = false
	}
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// writeTargets prints the targets table.
func writeTargets(w io.Writer, ts []targetResult) {
	fmt.Fprintln(w, "\nTargets (issues 9 and 13), each from rows of this run (a ratio: the median of its paired rounds, see -rounds):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | figure | against | ratio | goal | result |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | --- | --- |")
	opSign := map[string]string{"<=": "≤", ">=": "≥", "<": "<"}
	for _, t := range ts {
		fig, against, ratio := "—", "—", "—"
		if t.Status != "n/a" {
			fig = fmtValue(t.Value, t.Unit)
			if t.Against != "" {
				against = fmtValue(t.AgainstValue, t.Unit)
				ratio = fmtRatio(t.Ratio)
			}
		}
		goal := opSign[t.Op] + " " + strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", t.Limit), "0"), ".")
		if t.Against != "" {
			goal += "×"
		} else if t.Unit == unitPercent {
			goal += "% of a core"
		} else {
			goal += " " + t.Unit
		}
		desc := t.Target
		if t.Note != "" {
			desc += " (" + t.Note + ")"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", strings.ReplaceAll(desc, "|", `\|`), fig, against, ratio, goal, t.Status)
	}
}

func fmtValue(v float64, unit string) string {
	switch unit {
	case unitNs, unitFastP99:
		return fmtLatency(v)
	case unitCallsPerSec:
		return fmtSI(v) + "/s"
	case unitPercent:
		return fmt.Sprintf("%.2f%%", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// fmtLatency prints ns/op as ns below 10µs, else µs.
func fmtLatency(ns float64) string {
	if ns < 10_000 {
		return fmtNs(ns) + " ns"
	}
	return fmt.Sprintf("%.1f µs", ns/1e3)
}

func fmtWindow(ns int64) string {
	return fmt.Sprintf("%.2fs", float64(ns)/1e9)
}
