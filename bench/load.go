//go:build linux

package main

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
)

// ============================================================================
// Rows under CPU load (issue 28), and Map rows.
//
// A loaded row is an existing row run while busy loops occupy the machine:
// one process per CPU spinning in a loop (this binary re-executed in the
// childHog role), at nice 0 (an ordinary loaded server: the busy loops get
// the same share as the row) or at nice 19 (background jobs, which the
// scheduler still runs for a slice when they wake to their turn). The busy
// loops start before the row's setup (so a pool starts on a loaded machine,
// as a server's would) and are killed after its cleanup, in every run of the
// row, the paired rounds' included. A loaded row is its idle row's name with
// " [N busy loops, nice K]" appended, and rowMeta.Load set.
//
// A Map row makes Task.Map calls of mapElements elements (the last one
// smaller if b.N is not a multiple), so its ns/op is per element.
// ============================================================================

// mapElements is how many elements a Map row's calls take.
const mapElements = 100_000

// shapeMap: Task.Map over mapElements elements (rowMeta.Window).
const shapeMap = "map"

// Loads named in rowMeta.Load.
const (
	loadBusy0  = "busy-nice0"  // one busy loop per CPU at nice 0
	loadBusy19 = "busy-nice19" // one busy loop per CPU at nice 19
)

// loads lists the loads of the loaded rows and their busy loops' niceness.
var loads = []struct {
	key  string
	nice int
}{{loadBusy0, 0}, {loadBusy19, 19}}

// loadLabel is a load's suffix in row names.
func loadLabel(load string) string {
	for _, l := range loads {
		if l.key == load {
			return fmt.Sprintf(" [%d busy loops, nice %d]", runtime.NumCPU(), l.nice)
		}
	}
	return ""
}

// childHog is the role of a busy loop.
const childHog = "hog"

// hogChildMain spins until it is killed (or its parent dies: Pdeathsig).
func hogChildMain() int {
	runtime.GOMAXPROCS(1)
	var x uint64
	for {
		x++
		if x == 0 {
			sink = x // never: keeps the loop from being removed
		}
	}
}

// startHogs starts one busy loop per CPU at the given niceness and returns
// a function that kills and reaps them.
func startHogs(nice int) (stop func(), err error) {
	var hogs []*child
	stop = func() {
		for _, h := range hogs {
			h.kill()
		}
	}
	for range runtime.NumCPU() {
		h, err := startChild(childHog)
		if err != nil {
			stop()
			return nil, err
		}
		hogs = append(hogs, h)
		if nice != 0 {
			if err := unix.Setpriority(unix.PRIO_PROCESS, h.cmd.Process.Pid, nice); err != nil {
				stop()
				return nil, fmt.Errorf("setpriority %d: %w", nice, err)
			}
		}
	}
	// Let them be running (and, at nice 19, reniced) before the row starts.
	time.Sleep(50 * time.Millisecond)
	return stop, nil
}

// loaded returns s run beside one busy loop per CPU at the load's niceness.
func loaded(s scenario, load string, nice int) scenario {
	s.name += loadLabel(load)
	s.meta.Load = load
	if s.setup == nil {
		return s
	}
	inner := s.setup
	s.setup = func() (func(*testing.B), func() error, error) {
		stop, err := startHogs(nice)
		if err != nil {
			return nil, nil, err
		}
		body, cleanup, err := inner()
		if err != nil {
			stop()
			return nil, nil, err
		}
		return body, func() error {
			err := cleanup()
			stop()
			return err
		}, nil
	}
	return s
}

// loadScenarios: the loaded rows (the rows the issue 28 targets compare,
// under each load) and the Map rows (idle and loaded).
func loadScenarios(all []scenario) []scenario {
	byMeta := map[rowMeta]scenario{}
	for _, s := range all {
		if s.meta.Impl != "" {
			byMeta[s.meta] = s
		}
	}
	var base []scenario
	for _, m := range loadedRows {
		s, ok := byMeta[m]
		if !ok {
			panic(fmt.Sprintf("loaded row %+v: no such row", m))
		}
		base = append(base, s)
	}
	maps := mapScenarios()
	var rows []scenario
	rows = append(rows, maps...)
	for _, l := range loads {
		for _, s := range base {
			rows = append(rows, loaded(s, l.key, l.nice))
		}
		for _, s := range maps {
			rows = append(rows, loaded(s, l.key, l.nice))
		}
	}
	return rows
}

// loadedRows are the rows measured under load too: the two sides of every
// issue 28 target.
var loadedRows = []rowMeta{
	{Impl: implChanUnbuffered, Shape: shapeRoundTrip, Lanes: 1},
	{Impl: implChanPool, Shape: shapeGoroutines, Lanes: poolWorkers, Window: inFlightTarget},
	{Impl: implUnixSocket, Shape: shapeRoundTrip, Lanes: 1},
	{Impl: implUnixSocket, Shape: shapePipelined, Lanes: 1, Window: inFlightTarget},
	{Impl: implKnitProcess, Shape: shapeRoundTrip, Lanes: 1},
	{Impl: implKnitProcess, Shape: shapeWindow, Lanes: poolWorkers, Window: inFlightTarget},
	{Impl: implKnitGoroutine, Shape: shapeRoundTrip, Lanes: 1},
	{Impl: implKnitGoroutine, Shape: shapeGoroutines, Lanes: poolWorkers, Window: inFlightTarget},
}

// mapScenarios: Task.Map of mapElements elements on 2 lanes, both runtimes,
// default Config.
func mapScenarios() []scenario {
	var rows []scenario
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		impl := implKnitGoroutine
		if rt == knit.Process {
			impl = implKnitProcess
		}
		cfg := knit.Config{Lanes: poolWorkers, Runtime: rt}
		rows = append(rows, scenario{
			name:     fmt.Sprintf("knit %s, %d lanes: Map of %d", rt, poolWorkers, mapElements),
			inFlight: mapElements,
			meta:     rowMeta{Impl: impl, Shape: shapeMap, Lanes: poolWorkers, Window: mapElements},
			setup:    func() (func(*testing.B), func() error, error) { return setupKnitMap(cfg, mapElements) },
		})
	}
	return rows
}

// setupKnitMap: Task.Map over n elements at a time, b.N elements in all.
func setupKnitMap(cfg knit.Config, n int) (func(*testing.B), func() error, error) {
	kp, err := newKnitPool(cfg)
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	in := make([]uint64, n)
	var seq uint64
	body := func(b *testing.B) {
		for left := b.N; left > 0; {
			k := min(left, n)
			left -= k
			for i := range k {
				seq++
				in[i] = seq
			}
			out, err := knitInc.Map(ctx, kp.Pool, in[:k])
			if err != nil {
				fail(b, kp.failure(err))
				return
			}
			for i, v := range out {
				if v != in[i]+1 {
					fail(b, fmt.Errorf("knit Map: element %d: got %d, want %d", i, v, in[i]+1))
					return
				}
			}
		}
	}
	return body, kp.cleanup, nil
}

// loadTargets are issue 28's targets: Map and 1024 futures against their
// peers on an idle machine, and under each load every knit row against
// its peer under the same load.
func loadTargets(rs rowSet) []targetResult {
	var ts []targetResult
	add := func(desc string, unit string, a, b *result, op string, limit float64, aName, bName string) {
		ts = append(ts, ratioTarget("issue 28: "+desc, a, b, unit, op, limit, aName, bName))
	}
	goMap := func(load string) *result {
		return rs.findLoad(implKnitGoroutine, shapeMap, poolWorkers, mapElements, load)
	}
	procMap := func(load string) *result {
		return rs.findLoad(implKnitProcess, shapeMap, poolWorkers, mapElements, load)
	}
	chanPool := func(load string) *result {
		return rs.findLoad(implChanPool, shapeGoroutines, poolWorkers, inFlightTarget, load)
	}
	pipelined := func(load string) *result {
		return rs.findLoad(implUnixSocket, shapePipelined, 1, inFlightTarget, load)
	}
	goMapName := fmt.Sprintf("knit goroutine, %d lanes: Map of %d", poolWorkers, mapElements)
	procMapName := fmt.Sprintf("knit process, %d lanes: Map of %d", poolWorkers, mapElements)
	chanPoolName := fmt.Sprintf("chan: pool of %d workers, %d in flight", poolWorkers, inFlightTarget)
	pipelinedName := fmt.Sprintf("unix socket child: pipelined, %d in flight", inFlightTarget)

	add(fmt.Sprintf("Map of %d, goroutine lanes ÷ channel pool of %d, %d in flight (throughput)", mapElements, poolWorkers, inFlightTarget),
		unitCallsPerSec, goMap(""), chanPool(""), ">=", 2, goMapName, chanPoolName)
	add(fmt.Sprintf("Map of %d, process lanes ÷ unix-socket child pipelined (throughput)", mapElements),
		unitCallsPerSec, procMap(""), pipelined(""), ">=", 1, procMapName, pipelinedName)
	add(fmt.Sprintf("%d futures from one goroutine, goroutine lanes ÷ channel pool of %d, window %d (throughput)", inFlightTarget, poolWorkers, inFlightTarget),
		unitCallsPerSec, rs.find(implKnitGoroutine, shapeWindow, poolWorkers, inFlightTarget),
		rs.find(implChanPool, shapeWindow, poolWorkers, inFlightTarget), ">=", 0.5,
		"knit goroutine, 2 lanes: window 1024", "chan: pool of 2 workers, window 1024")
	add(fmt.Sprintf("%d futures from one goroutine, goroutine lanes ÷ channel pool of %d, %d goroutines (throughput)", inFlightTarget, poolWorkers, inFlightTarget),
		unitCallsPerSec, rs.find(implKnitGoroutine, shapeWindow, poolWorkers, inFlightTarget), chanPool(""), ">=", 0.5,
		"knit goroutine, 2 lanes: window 1024", chanPoolName)
	add(fmt.Sprintf("%d futures from one goroutine, process lanes ÷ unix-socket child pipelined (throughput)", inFlightTarget),
		unitCallsPerSec, rs.find(implKnitProcess, shapeWindow, poolWorkers, inFlightTarget), pipelined(""), ">=", 0.5,
		"knit process, 2 lanes: window 1024", pipelinedName)

	for _, l := range loads {
		ll := loadLabel(l.key)
		add("process lane sequential Call ÷ unix-socket child round trip"+ll, unitNs,
			rs.findLoad(implKnitProcess, shapeRoundTrip, 1, 0, l.key), rs.findLoad(implUnixSocket, shapeRoundTrip, 1, 0, l.key),
			"<=", 1, "knit process, 1 lane: sequential Call"+ll, "unix socket child: round trip"+ll)
		add(fmt.Sprintf("process lanes, window %d, %d lanes ÷ unix-socket child pipelined%s (throughput)", inFlightTarget, poolWorkers, ll), unitCallsPerSec,
			rs.findLoad(implKnitProcess, shapeWindow, poolWorkers, inFlightTarget, l.key), pipelined(l.key),
			">=", 0.5, "knit process, 2 lanes: window 1024"+ll, pipelinedName+ll)
		add("goroutine lane sequential Call ÷ unbuffered channel round trip"+ll, unitNs,
			rs.findLoad(implKnitGoroutine, shapeRoundTrip, 1, 0, l.key), rs.findLoad(implChanUnbuffered, shapeRoundTrip, 1, 0, l.key),
			"<=", 1.5, "knit goroutine, 1 lane: sequential Call"+ll, "chan: unbuffered round trip"+ll)
		add(fmt.Sprintf("%d goroutines calling, %d goroutine lanes ÷ channel pool of %d%s (throughput)", inFlightTarget, poolWorkers, poolWorkers, ll), unitCallsPerSec,
			rs.findLoad(implKnitGoroutine, shapeGoroutines, poolWorkers, inFlightTarget, l.key), chanPool(l.key),
			">=", 0.5, "knit goroutine, 2 lanes: 1024 goroutines calling"+ll, chanPoolName+ll)
		add(fmt.Sprintf("Map of %d, goroutine lanes ÷ channel pool of %d, %d in flight%s (throughput)", mapElements, poolWorkers, inFlightTarget, ll),
			unitCallsPerSec, goMap(l.key), chanPool(l.key), ">=", 0.5, goMapName+ll, chanPoolName+ll)
		add(fmt.Sprintf("Map of %d, process lanes ÷ unix-socket child pipelined%s (throughput)", mapElements, ll),
			unitCallsPerSec, procMap(l.key), pipelined(l.key), ">=", 0.5, procMapName+ll, pipelinedName+ll)
	}
	return ts
}

// loadPlots draws the rows under load beside their idle rows: the load is
// the x axis (idle, busy loops at nice 19, at nice 0).
func loadPlots(rs rowSet, latencyUs, callsPerSec func(*result) float64) []plotSpec {
	keys := []string{"", loadBusy19, loadBusy0}
	names := []string{"idle", fmt.Sprintf("%d busy loops, nice 19", runtime.NumCPU()), fmt.Sprintf("%d busy loops, nice 0", runtime.NumCPU())}
	xs := []int{1, 2, 3}
	series := func(impl, shape string, lanes, window int) []*result {
		out := make([]*result, len(keys))
		for i, k := range keys {
			out[i] = rs.findLoad(impl, shape, lanes, window, k)
		}
		return out
	}
	return []plotSpec{
		{
			file:   "latency-under-load",
			title:  "Sequential call latency, idle and beside busy loops (default Config)",
			xLabel: "what else runs",
			yLabel: "latency per call, µs (log)",
			xs:     xs, xNames: names, y: latencyUs,
			lines: []plotLine{
				{"knit process, 1 lane: sequential Call", series(implKnitProcess, shapeRoundTrip, 1, 0)},
				{"unix socket child: round trip", series(implUnixSocket, shapeRoundTrip, 1, 0)},
				{"knit goroutine, 1 lane: sequential Call", series(implKnitGoroutine, shapeRoundTrip, 1, 0)},
				{"chan: unbuffered round trip", series(implChanUnbuffered, shapeRoundTrip, 1, 0)},
			},
		},
		{
			file:   "throughput-under-load",
			title:  "Throughput, idle and beside busy loops (default Config, 2 lanes or workers)",
			xLabel: "what else runs",
			yLabel: "calls/s (log)",
			xs:     xs, xNames: names, y: callsPerSec,
			lines: []plotLine{
				{fmt.Sprintf("knit process: Map of %d", mapElements), series(implKnitProcess, shapeMap, poolWorkers, mapElements)},
				{fmt.Sprintf("knit process: window %d", inFlightTarget), series(implKnitProcess, shapeWindow, poolWorkers, inFlightTarget)},
				{fmt.Sprintf("unix socket child: pipelined, %d in flight", inFlightTarget), series(implUnixSocket, shapePipelined, 1, inFlightTarget)},
				{fmt.Sprintf("knit goroutine: Map of %d", mapElements), series(implKnitGoroutine, shapeMap, poolWorkers, mapElements)},
				{fmt.Sprintf("knit goroutine: %d goroutines calling", inFlightTarget), series(implKnitGoroutine, shapeGoroutines, poolWorkers, inFlightTarget)},
				{fmt.Sprintf("chan: pool of %d workers, %d in flight", poolWorkers, inFlightTarget), series(implChanPool, shapeGoroutines, poolWorkers, inFlightTarget)},
			},
		},
	}
}
