//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// syntheticResults gives every classified row of the harness the same
// figures: 1µs per call, no allocations, an idle pool at 0.5% of a core;
// the skewed rows' fast calls a p99 of 1ms on private lanes and 100µs with
// stealing.
func syntheticResults() []result {
	var rs []result
	for _, s := range allScenarios() {
		r := result{Name: s.name, rowMeta: s.meta, InFlight: s.inFlight, N: 1000, NsPerOp: 1000, CallsPerSec: 1e6}
		if s.meta.Shape == shapeIdle {
			r = result{Name: s.name, rowMeta: s.meta, Idle: &idleResult{WindowNs: 1e9, CPUPercent: 0.5, HostPercent: 0.25, LanesPercent: 0.25, Source: "cpuclock"}}
		}
		if s.meta.Workload == workloadSkewed {
			r.FastP50Ns, r.FastP99Ns, r.FastCalls = 10e3, 1e6, 900
			if strings.HasPrefix(s.meta.Dispatch, "steal-") {
				r.FastP99Ns = 100e3
			}
		}
		rs = append(rs, r)
	}
	return rs
}

func targetStatus(t *testing.T, ts []targetResult) map[string]targetResult {
	t.Helper()
	m := map[string]targetResult{}
	for _, tg := range ts {
		if _, dup := m[tg.Target]; dup {
			t.Fatalf("duplicate target %q", tg.Target)
		}
		m[tg.Target] = tg
	}
	return m
}

func TestTargets(t *testing.T) {
	results := syntheticResults()
	ts := computeTargets(results)
	// 14 of issue 9, 4 per stealing discipline and runtime (Local: goroutines only), issue
	// 28's: 5 on an idle machine, 6 per load, and 7 of issue 32 (remote lanes: 6 and one
	// of knit's own).
	if len(ts) != 58 {
		t.Fatalf("%d targets, want 58", len(ts))
	}
	for _, tg := range ts {
		want := "PASS"
		switch {
		case strings.HasPrefix(tg.Target, "process lane sequential Call ÷ unix-socket") ||
			tg.Target == "issue 28: Map of 100000, goroutine lanes ÷ channel pool of 2, 1024 in flight (throughput)":
			want = "FAIL" // ratio 1 > 0.1, and 1 < 2
		case strings.HasPrefix(tg.Target, "remote lanes, 64 goroutines"):
			// ratio 1 >= 1
		case strings.HasPrefix(tg.Target, "remote lanes, ") && strings.Contains(tg.Target, "÷ protoactor remote"):
			want = "FAIL" // throughput ratio 1 < 2
		}
		if tg.Status != want {
			t.Errorf("%q: status %s, want %s (%+v)", tg.Target, tg.Status, want, tg)
		}
	}

	// A collapse at 8 process lanes, a slow 4-lane goroutine Call, an idle
	// pool at 2%, an allocating Call and a missing row.
	for i := range results {
		r := &results[i]
		switch {
		case r.Impl == implKnitProcess && r.Shape == shapeWindow && r.Lanes == 8:
			r.CallsPerSec, r.NsPerOp = 0.5e6, 2000
		case r.Impl == implKnitGoroutine && r.Shape == shapeRoundTrip && r.Lanes == 4:
			r.NsPerOp, r.CallsPerSec = 1600, 1e9/1600
		case r.Impl == implKnitProcess && r.Shape == shapeIdle:
			r.Idle.CPUPercent = 2
		case r.Impl == implKnitProcess && r.Shape == shapeGoroutines:
			r.AllocsPerOp = 3
		case r.Impl == implShmSpin:
			r.Err = "boom"
		case r.Impl == implKnitGoroutine && r.Shape == shapeGoroutines && r.Load == loadBusy19:
			r.CallsPerSec, r.NsPerOp = 0.4e6, 2500 // under half the channel pool's, beside nice-19 loops
		case r.Impl == implKnitGoroutine && r.Dispatch == dispatchTicket && r.Workload == workloadSkewed && r.Shape == shapeCallers:
			r.FastP99Ns = 500e3 // only 2× better than private lanes
		case r.Impl == implKnitGoroutine && r.Dispatch == dispatchDekker && r.Workload == workloadUniform && r.Shape == shapeWindow:
			r.CallsPerSec, r.NsPerOp = 0.8e6, 1250 // 20% slower than private lanes
		case r.Impl == implKnitProcess && r.Dispatch == dispatchRoundRobin && r.Workload == workloadUniform && r.Shape == shapeRoundTrip:
			r.Err = "boom"
		case r.Impl == implKnitProcess && r.Dispatch == "private-random" && r.Workload == workloadUniform && r.Shape == shapeWindow:
			r.CallsPerSec, r.NsPerOp = 2e6, 500 // the best private balancer
		case r.Impl == implKnitRemote && (r.Shape == shapeWindow || r.Shape == shapeMap):
			r.CallsPerSec, r.NsPerOp = 2.5e6, 400 // 2.5× protoactor's pipelined remote
		case r.Impl == implKnitRemote && r.Shape == shapeRoundTrip:
			r.NsPerOp, r.CallsPerSec = 1300, 1e9/1300 // 1.3× protoactor's round trip
		case r.Impl == implKnitRemoteTLS && r.Shape == shapeRoundTrip:
			r.NsPerOp, r.CallsPerSec = 1300, 1e9/1300 // the same as plaintext: TLS costs nothing
		}
	}
	m := targetStatus(t, computeTargets(results))
	check := func(prefix, status, noteHas string) {
		t.Helper()
		for name, tg := range m {
			if strings.HasPrefix(name, prefix) {
				if tg.Status != status || !strings.Contains(tg.Note, noteHas) {
					t.Errorf("%q: %s %q, want %s with %q", name, tg.Status, tg.Note, status, noteHas)
				}
				return
			}
		}
		t.Errorf("no target %q", prefix)
	}
	check("issue 28: process lane sequential Call ÷ unix-socket child round trip [", "PASS", "")
	check("issue 28: 1024 goroutines calling, 2 goroutine lanes ÷ channel pool of 2"+loadLabel(loadBusy19), "FAIL", "")
	check("issue 28: 1024 goroutines calling, 2 goroutine lanes ÷ channel pool of 2"+loadLabel(loadBusy0), "PASS", "")
	check("process lanes sweep", "FAIL", "worst: 8 lanes, best: 1 lanes")
	check("goroutine lanes sweep", "PASS", "")
	check("goroutine lanes sequential Call: 4 lanes", "FAIL", "")
	check("process lanes sequential Call: 4 lanes", "PASS", "")
	check("idle pool", "FAIL", "host 0.25%")
	check("knit allocs per Call, largest over the 1024 goroutines", "FAIL", "knit process, 2 lanes: 1024 goroutines calling")
	check("knit allocs per Call, largest over the sequential", "PASS", "")
	check("process lane sequential Call ÷ shm spin", "n/a", "shm spin child: round trip")
	check("goroutine lanes, free lane (skewed, 3 callers): fast-call p99, steal Ticket ÷ steal off, LeastLoaded", "FAIL", "")
	check("goroutine lanes, free lane (skewed, 3 callers): fast-call p99, steal Ticket ÷ steal off, RoundRobin", "FAIL", "")
	check("goroutine lanes, free lane (skewed, 3 callers): fast-call p99, steal Dekker ÷ steal off, RoundRobin", "PASS", "")
	check("goroutine lanes, uniform, window 1024: steal Dekker ÷ best", "FAIL", "best private: knit goroutine, 4 lanes, steal off, LeastLoaded: uniform, window 1024")
	check("goroutine lanes, uniform, window 1024: steal Ticket ÷ best", "PASS", "")
	check("process lanes, uniform, window 1024: steal Ticket ÷ best", "FAIL", "best private: knit process, 4 lanes, steal off, Random: uniform, window 1024")
	check("process lanes, uniform, sequential Call: steal Dekker ÷ best", "n/a", "steal off, RoundRobin: uniform, sequential Call")
	check("remote lane sequential Call ÷ protoactor remote", "FAIL", "")
	check("remote lanes, window 1024 ÷ protoactor remote", "PASS", "")
	check("remote lanes, Map of 1024 ÷ protoactor remote", "PASS", "")
	check("remote lanes, 1024 goroutines calling ÷ protoactor remote", "FAIL", "")
	check("cost of TLS: remote lane sequential Call", "PASS", "the issue asks for the figure")
	check("cost of TLS: remote lanes, window 1024", "FAIL", "the issue asks for the figure") // 1e6 ÷ 2.5e6

	var buf bytes.Buffer
	writeTargets(&buf, computeTargets(results))
	for _, want := range []string{"| target | figure | against | ratio | goal | result |", "| 2.00% | — | — | < 1% of a core | FAIL |", "≥ 0.67×", "| n/a |"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("targets table lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestPlotFrom writes a -json report, renders it with -plot-from and
// checks the tables and the three plots, in both vector and raster form.
func TestPlotFrom(t *testing.T) {
	dir := t.TempDir()
	rep := report{Meta: runMeta{GoVersion: "go1.x", NumCPU: 2, Benchtime: "1s"}, Results: syntheticResults()}
	// Spread the sweeps so the log axes have a range.
	for i := range rep.Results {
		r := &rep.Results[i]
		if r.Window > 0 {
			r.CallsPerSec = 1e4 * float64(r.Window)
		}
		if r.Shape == shapeRoundTrip {
			r.NsPerOp = 500 * float64(max(r.Lanes, 1))
		}
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "run.json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"svg", "png"} {
		plots := filepath.Join(dir, format)
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-plot-from", file, "-plots", plots, "-plot-format", format}, &stdout, &stderr); code != 0 {
			t.Fatalf("-plot-from exited %d: %s", code, stderr.String())
		}
		if !strings.Contains(stdout.String(), "| scenario | ns/op |") || !strings.Contains(stdout.String(), "Targets (issues 9 and 13)") {
			t.Fatalf("-plot-from output lacks the tables:\n%s", stdout.String())
		}
		for _, name := range []string{"latency-vs-lanes", "throughput-vs-lanes", "throughput-vs-window", "latency-under-load", "throughput-under-load"} {
			fi, err := os.Stat(filepath.Join(plots, name+"."+format))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() < 1000 {
				t.Errorf("%s.%s is only %d bytes", name, format, fi.Size())
			}
		}
	}

	// -json from -plot-from carries the targets, recomputed.
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-plot-from", file, "-json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("-plot-from -json exited %d: %s", code, stderr.String())
	}
	var back report
	if err := json.Unmarshal(stdout.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Targets) == 0 || len(back.Results) != len(rep.Results) || back.Results[0].Impl != rep.Results[0].Impl {
		t.Fatalf("round trip lost data: %d targets, %d results", len(back.Targets), len(back.Results))
	}
}

func TestParseStatTicks(t *testing.T) {
	// The command name may hold spaces and parentheses.
	line := "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 3 0 100 1000 10 18446744073709551615"
	got, err := parseStatTicks(line)
	if err != nil || got != 22 {
		t.Fatalf("parseStatTicks = %d, %v; want 22", got, err)
	}
	if _, err := parseStatTicks("1 (x) S 1 2"); err == nil {
		t.Fatal("short line: no error")
	}
	if _, err := sampleCPU(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}

// TestApplyRounds: a target with paired rounds is judged by the median of the
// rounds' ratios, whatever the main pass said; a failed round is left out, and
// a target without rounds keeps the main pass.
func TestApplyRounds(t *testing.T) {
	ts := computeTargets(syntheticResults())
	byName := targetStatus(t, ts)
	const goWindow = "goroutine lanes, window 1024, 2 lanes ÷ channel pool of 2, same shape (throughput)"
	tg := byName[goWindow]
	if tg.Status != "PASS" {
		t.Fatalf("main pass: %+v", tg)
	}
	pairs := targetPairs(ts)
	if !slices.Contains(pairs, [2]string{tg.Row, tg.Against}) {
		t.Fatalf("pair %q ÷ %q not listed: %v", tg.Row, tg.Against, pairs)
	}
	for i, p := range pairs {
		if slices.Contains(pairs[i+1:], p) {
			t.Fatalf("pair %v listed twice", p)
		}
	}
	row := func(name string, ns float64) result {
		return result{Name: name, N: 1000, NsPerOp: ns, CallsPerSec: 1e9 / ns}
	}
	// knit's ns/op 400, 300 and 200 against the channel pool's 100, 200 and
	// 100: throughput ratios 0.25, 0.667 and 0.5; the failed round is dropped.
	rounds := []pairRound{
		{Row: tg.Row, Against: tg.Against, A: row(tg.Row, 400), B: row(tg.Against, 100)},
		{Row: tg.Row, Against: tg.Against, A: row(tg.Row, 300), B: row(tg.Against, 200)},
		{Row: tg.Row, Against: tg.Against, A: row(tg.Row, 200), B: row(tg.Against, 100)},
		{Row: tg.Row, Against: tg.Against, A: result{Name: tg.Row, Err: "boom"}, B: row(tg.Against, 1)},
	}
	applyRounds(ts, rounds)
	got := targetStatus(t, ts)
	tg = got[goWindow]
	if tg.Status != "FAIL" || tg.Ratio != 0.5 || !strings.Contains(tg.Note, "median of 3 paired rounds") {
		t.Fatalf("after rounds: %+v", tg)
	}
	if want := 1e9 / 300.0; tg.Value != want || tg.AgainstValue != 1e9/100.0 {
		t.Fatalf("medians: value %v against %v", tg.Value, tg.AgainstValue)
	}
	other := got["goroutine lane sequential Call ÷ unbuffered channel round trip"]
	if other.Status != "PASS" || other.Ratio != 1 || other.Note != "" {
		t.Fatalf("a target without rounds changed: %+v", other)
	}
	if m := median([]float64{3, 1, 2, 10}); m != 2.5 {
		t.Fatalf("median = %v", m)
	}
}

// TestMeasurePairs: each round measures a pair's two rows back to back, the first row first
// in even rounds and second in odd ones, and files each result under its own row.
func TestMeasurePairs(t *testing.T) {
	old := flag.Lookup("test.benchtime").Value.String()
	defer flag.Set("test.benchtime", old)
	if err := flag.Set("test.benchtime", "1x"); err != nil {
		t.Fatal(err)
	}
	var order []string
	row := func(name string) scenario {
		return scenario{name: name, setup: func() (func(*testing.B), func() error, error) {
			body := func(b *testing.B) { order = append(order, name) }
			return body, func() error { return nil }, nil
		}}
	}
	all := []scenario{row("a"), row("b")}
	rounds := measurePairs([][2]string{{"a", "b"}, {"a", "missing"}}, all, 2, 0, time.Second, io.Discard)
	if got := strings.Join(order, ","); got != "a,b,b,a" {
		t.Fatalf("order %s, want a,b,b,a", got)
	}
	if len(rounds) != 2 {
		t.Fatalf("%d rounds, want 2 (the pair with an unknown row is skipped)", len(rounds))
	}
	for _, r := range rounds {
		if r.Row != "a" || r.Against != "b" || r.A.Name != "a" || r.B.Name != "b" || !measured(&r.A) || !measured(&r.B) {
			t.Fatalf("round filed wrong: %+v", r)
		}
	}
}

// TestMeasurePairsInterleaved: with -interleave a round-trip pair is set up once per round,
// both rows at once, and its rows take turns, the first row first in even rounds; each
// row's result sums its slices. A row with more than one call in flight runs as before.
func TestMeasurePairsInterleaved(t *testing.T) {
	old := flag.Lookup("test.benchtime").Value.String()
	defer flag.Set("test.benchtime", old)
	var order []string
	setups, cleanups := 0, 0
	row := func(name string, inFlight int) scenario {
		return scenario{name: name, inFlight: inFlight, setup: func() (func(*testing.B), func() error, error) {
			setups++
			body := func(b *testing.B) {
				if len(order) == 0 || order[len(order)-1] != name {
					order = append(order, name)
				}
			}
			return body, func() error { cleanups++; return nil }, nil
		}}
	}
	all := []scenario{row("a", 1), row("b", 1), row("w", 1024)}
	rounds := measurePairs([][2]string{{"a", "b"}}, all, 2, 3, 3*time.Millisecond, io.Discard)
	if got := strings.Join(order, ","); got != "a,b,a,b,a,b,a,b,a,b,a" { // round 1 starts with b
		t.Fatalf("order %s, want three turns a,b then three b,a", got)
	}
	if setups != 4 || cleanups != 4 {
		t.Fatalf("%d setups and %d cleanups, want 4 each (both rows once a round)", setups, cleanups)
	}
	if got := flag.Lookup("test.benchtime").Value.String(); got != "3ms" {
		t.Fatalf("benchtime left at %s, want 3ms restored", got)
	}
	for _, r := range rounds {
		if r.Slices != 3 || r.A.Name != "a" || r.B.Name != "b" || !measured(&r.A) || !measured(&r.B) || r.A.Err != "" {
			t.Fatalf("round filed wrong: %+v", r)
		}
	}
	order = nil
	if err := flag.Set("test.benchtime", "1x"); err != nil {
		t.Fatal(err)
	}
	rounds = measurePairs([][2]string{{"w", "a"}}, all, 1, 3, time.Second, io.Discard)
	if got := strings.Join(order, ","); got != "w,a" || rounds[0].Slices != 0 {
		t.Fatalf("a window row interleaved: order %s, slices %d", got, rounds[0].Slices)
	}

	// Two rows that cannot be set up together run one after the other.
	alive := 0
	solo := func(name string) scenario {
		return scenario{name: name, inFlight: 1, setup: func() (func(*testing.B), func() error, error) {
			if alive > 0 {
				return nil, nil, errors.New("one at a time")
			}
			alive++
			body := func(b *testing.B) {
				if len(order) == 0 || order[len(order)-1] != name {
					order = append(order, name)
				}
			}
			return body, func() error { alive--; return nil }, nil
		}}
	}
	order = nil
	rounds = measurePairs([][2]string{{"x", "y"}}, []scenario{solo("x"), solo("y")}, 1, 3, time.Second, io.Discard)
	if got := strings.Join(order, ","); got != "x,y" || rounds[0].Slices != 0 || !measured(&rounds[0].A) || !measured(&rounds[0].B) {
		t.Fatalf("rows that cannot run together: order %s, round %+v", got, rounds[0])
	}
}

func TestSummarize(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- { // out of order: summarize sorts
		ds = append(ds, time.Duration(i)*time.Microsecond)
	}
	q := summarize(ds)
	want := quantiles{mean: 50500 * time.Nanosecond, p50: 50 * time.Microsecond, p90: 90 * time.Microsecond, p99: 99 * time.Microsecond}
	if q != want {
		t.Fatalf("summarize: %+v, want %+v", q, want)
	}
	if q := summarize(nil); q != (quantiles{}) {
		t.Fatalf("summarize(nil): %+v", q)
	}
}
