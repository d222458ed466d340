//go:build linux

package main

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// inFlightTarget is the number of concurrent calls used by every
// "throughput" row.
const inFlightTarget = 1024

// poolWorkers is the worker count of every bounded pool (channel pool, ants,
// pond). It matches the 2 vCPUs of the reference machine and is fixed so the
// rows stay comparable across machines.
const poolWorkers = 2

// windowSweep is the set of window sizes of the sliding-window rows (the
// "throughput vs in-flight window" plot). The last one, inFlightTarget, is
// the window of the main throughput rows.
var windowSweep = []int{1, 8, 64, 256, inFlightTarget}

// laneSweep is the set of lane counts of knit's lanes sweep.
var laneSweep = []int{1, 2, 4, 8}

// scenario is one row of the table.
type scenario struct {
	// name is the row label. Keep it unique and stable: -filter and -ref
	// match against it, and JSON consumers key on it.
	name string
	// inFlight is the number of calls outstanding at once: 1 for a round
	// trip, inFlightTarget for a throughput row.
	inFlight int
	// slow rows are skipped with -short.
	slow bool
	// meta classifies the row for the targets table and the plots (see
	// rowMeta); rows without it are looked up by no one.
	meta rowMeta
	// setup prepares everything the row needs (pools, actors, child
	// processes) outside the timed region. It returns the body handed to
	// testing.Benchmark (which may call it several times with growing b.N)
	// and a cleanup that must release everything, reap children included.
	setup func() (body func(b *testing.B), cleanup func() error, err error)
	// measure, if set, replaces setup and testing.Benchmark for a row that
	// is not a timed loop (the idle rows): it fills in res or fails.
	measure func(res *result) error
}

// rowMeta says what a row measures, so the targets table and the plots find
// their rows by kind rather than by label. The zero value means "not
// classified".
type rowMeta struct {
	// Impl is what is measured: one of the impl* constants.
	Impl string `json:"impl,omitempty"`
	// Shape is how it is driven: one of the shape* constants.
	Shape string `json:"shape,omitempty"`
	// Lanes is the number of lanes (knit) or workers (channel pool).
	Lanes int `json:"lanes,omitempty"`
	// Window is the number of calls in flight for the window, goroutines
	// and pipelined shapes.
	Window int `json:"window,omitempty"`
	// Workload is the task mix of the stealing rows (workloadSkewed or
	// workloadUniform); "" for every other row (knitInc, or a peer's
	// equivalent).
	Workload string `json:"workload,omitempty"`
	// Dispatch is how a stealing row's pool dispatches calls (dispatch*
	// keys: a steal discipline, or private lanes and their balancer); ""
	// for every other row (knit rows with the default Config).
	Dispatch string `json:"dispatch,omitempty"`
	// Load is what else runs on the machine while the row runs (load*
	// keys: busy loops, load.go); "" for an otherwise idle machine.
	Load string `json:"load,omitempty"`
}

// Implementations named in rowMeta.Impl.
const (
	implKnitGoroutine  = "knit-goroutine"  // knit, default Config, goroutine lanes
	implKnitProcess    = "knit-process"    // knit, default Config, process lanes
	implChanUnbuffered = "chan-unbuffered" // one worker behind two unbuffered channels
	implChanPool       = "chan-pool"       // poolWorkers goroutines reading a buffered job channel
	implUnixSocket     = "unix-socket"     // the echoing child over a socketpair
	implShmSpin        = "shm-spin"        // the spinning shared-memory child
)

// Shapes named in rowMeta.Shape.
const (
	// shapeRoundTrip: one call in flight, made by one goroutine (for knit,
	// sequential Task.Call).
	shapeRoundTrip = "round-trip"
	// shapeWindow: one goroutine keeps a window of Window calls in flight:
	// it starts Window, then repeatedly waits for the oldest and starts one
	// more (for knit, Task.Go and Future.Wait).
	shapeWindow = "window"
	// shapeGoroutines: Window goroutines each make one blocking call after
	// another (runInFlight).
	shapeGoroutines = "goroutines"
	// shapePipelined: a writer goroutine keeps Window messages outstanding,
	// a reader goroutine drains the replies (unix socket only).
	shapePipelined = "pipelined"
	// shapeIdle: CPU time of a started pool doing nothing (measure rows).
	shapeIdle = "idle"
)

// result is one measured row.
type result struct {
	Name string `json:"name"`
	rowMeta
	InFlight    int     `json:"in_flight"`
	N           int     `json:"n"`
	NsPerOp     float64 `json:"ns_per_op"`
	CallsPerSec float64 `json:"calls_per_sec"`
	AllocsPerOp float64 `json:"allocs_per_op"`
	BytesPerOp  float64 `json:"bytes_per_op"`
	Ratio       float64 `json:"ratio_vs_ref,omitempty"`
	Reference   bool    `json:"reference,omitempty"`
	Skipped     string  `json:"skipped,omitempty"`
	Err         string  `json:"error,omitempty"`
	// Idle is set for the idle rows (shapeIdle), which have no ns/op.
	Idle *idleResult `json:"idle,omitempty"`
	// FastP50Ns and FastP99Ns are the latency percentiles of the fast
	// calls of a skewed row (workloadSkewed), over FastCalls samples.
	FastP50Ns float64 `json:"fast_p50_ns,omitempty"`
	FastP99Ns float64 `json:"fast_p99_ns,omitempty"`
	FastCalls int     `json:"fast_calls,omitempty"`
}

// failure keeps the first error reported by a benchmark body. testing.B
// writes its log to a discarded writer when driven by testing.Benchmark, so
// the message would otherwise be lost.
var failure struct {
	sync.Mutex
	err error
}

// fail records err and marks b failed. It is safe to call from RunParallel
// bodies and helper goroutines; the caller must return afterwards.
func fail(b *testing.B, err error) {
	recordFailure(err)
	b.Error(err)
}

// recordFailure keeps err unless an earlier error is already recorded.
func recordFailure(err error) {
	failure.Lock()
	if failure.err == nil {
		failure.err = err
	}
	failure.Unlock()
}

func takeFailure() error {
	failure.Lock()
	defer failure.Unlock()
	err := failure.err
	failure.err = nil
	return err
}

// runInFlight runs body from enough goroutines that inFlightTarget calls
// are outstanding at once.
func runInFlight(b *testing.B, body func(pb *testing.PB)) { runGoroutines(b, inFlightTarget, body) }

// runGoroutines runs body from about n goroutines (RunParallel starts
// parallelism*GOMAXPROCS goroutines).
func runGoroutines(b *testing.B, n int, body func(pb *testing.PB)) {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((n + procs - 1) / procs)
	b.RunParallel(body)
}

// runScenario sets s up, measures it with testing.Benchmark and tears it
// down again.
func runScenario(s scenario) (res result) {
	res = result{Name: s.name, InFlight: s.inFlight, rowMeta: s.meta}
	if s.measure != nil {
		if err := s.measure(&res); err != nil {
			res.Err = err.Error()
		}
		return res
	}
	body, cleanup, err := s.setup()
	if err != nil {
		res.Err = "setup: " + err.Error()
		return res
	}
	defer res.cleanUp(cleanup)

	takeFailure()
	takeFastLatency()
	runtime.GC()
	br, err := benchmark(body)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.fill(br)
	if p50, p99, n, ok := takeFastLatency(); ok {
		res.FastP50Ns, res.FastP99Ns, res.FastCalls = p50, p99, n
	}
	return res
}

// benchmark runs body under testing.Benchmark (for -test.benchtime).
func benchmark(body func(*testing.B)) (testing.BenchmarkResult, error) {
	br := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		body(b)
		if b.Failed() {
			recordFailure(errors.New("benchmark failed"))
		}
	})
	if err := takeFailure(); err != nil {
		return br, err
	}
	if br.N == 0 || br.T <= 0 {
		return br, errors.New("benchmark did not run")
	}
	return br, nil
}

// cleanUp runs a row's cleanup and keeps its error unless the row failed first.
func (res *result) cleanUp(cleanup func() error) {
	if err := cleanup(); err != nil && res.Err == "" {
		res.Err = "cleanup: " + err.Error()
	}
}

// fill sets the row's figures from br (which may sum several runs).
func (res *result) fill(br testing.BenchmarkResult) {
	res.N = br.N
	res.NsPerOp = float64(br.T.Nanoseconds()) / float64(br.N)
	res.CallsPerSec = 1e9 / res.NsPerOp
	res.AllocsPerOp = float64(br.MemAllocs) / float64(br.N)
	res.BytesPerOp = float64(br.MemBytes) / float64(br.N)
}

// allScenarios lists the rows in table order. knit's own rows come last,
// from knitScenarios in knit.go.
func allScenarios() []scenario {
	var all []scenario
	all = append(all, inProcScenarios()...)
	all = append(all, poolScenarios()...)
	all = append(all, actorScenarios()...)
	all = append(all, processScenarios()...)
	all = append(all, knitScenarios()...)
	all = append(all, knitSweepScenarios()...)
	all = append(all, stealScenarios()...)
	all = append(all, remoteScenarios()...)
	return append(all, loadScenarios(all)...)
}

// checkNames panics on duplicate row names (a programming error).
func checkNames(all []scenario) {
	seen := map[string]bool{}
	for _, s := range all {
		if seen[s.name] {
			panic(fmt.Sprintf("duplicate scenario name %q", s.name))
		}
		seen[s.name] = true
	}
}
