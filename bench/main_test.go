//go:build linux

package main

import (
	"bytes"
	"flag"
	"fmt"
	"github.com/knitgo/knit"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain lets the test binary act as the child process too: the process
// rows re-execute os.Executable(), which under go test is this binary.
func TestMain(m *testing.M) {
	quietPeers()
	knit.Main()
	if code, isChild := runChildIfRequested(); isChild {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestScenariosOnce runs every row once with a small fixed count (twice
// the row's calls in flight, at least 256: enough to overflow the window of
// the throughput and window rows) and the idle rows with a short window,
// skipping the rows that -short skips, so `go test ./...` checks that each
// scenario, child processes included, works and cleans up.
func TestScenariosOnce(t *testing.T) {
	old := flag.Lookup("test.benchtime").Value.String()
	defer flag.Set("test.benchtime", old)
	oldIdle := idleWindow
	idleWindow = 50 * time.Millisecond
	defer func() { idleWindow = oldIdle }()

	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	defer checkNoChildren(t)
	all := allScenarios()
	checkNames(all)
	var results []result
	for _, s := range all {
		t.Run(s.name, func(t *testing.T) {
			if s.slow {
				t.Skip("slow row; skipped as with -short")
			}
			if err := flag.Set("test.benchtime", fmt.Sprintf("%dx", max(256, 2*s.inFlight))); err != nil {
				t.Fatal(err)
			}
			r := runScenario(s)
			if r.Err != "" {
				t.Fatal(r.Err)
			}
			if s.meta.Shape == shapeIdle {
				if r.Idle == nil || r.Idle.WindowNs < idleWindow.Nanoseconds() || r.Idle.CPUPercent < 0 {
					t.Fatalf("no idle measurement: %+v", r)
				}
				if s.meta.Impl == implKnitProcess && len(r.Idle.LanePIDs) != knitIdleLanes {
					t.Fatalf("idle row measured %d lane processes, want %d: %+v", len(r.Idle.LanePIDs), knitIdleLanes, r.Idle)
				}
			} else if r.N < 1 || r.NsPerOp <= 0 {
				t.Fatalf("no measurement: %+v", r)
			}
			results = append(results, r)
		})
	}
	// Every target finds its rows (the figures of a smoke run mean
	// nothing, so PASS and FAIL are both fine).
	for _, tg := range computeTargets(results) {
		if tg.Status == "n/a" {
			t.Errorf("target %q: %s", tg.Target, tg.Note)
		}
	}
}

func TestTableAndReference(t *testing.T) {
	results := []result{
		{Name: "a", NsPerOp: 10},
		{Name: defaultRef, NsPerOp: 100},
		{Name: "c", Skipped: "-short"},
		{Name: "d", Err: "boom | bang"},
	}
	if ref := applyReference(results, defaultRef); ref != defaultRef {
		t.Fatalf("reference = %q", ref)
	}
	if results[0].Ratio != 0.1 || !results[1].Reference || results[1].Ratio != 1 {
		t.Fatalf("ratios wrong: %+v", results)
	}
	var buf bytes.Buffer
	writeTable(&buf, runMeta{Reference: defaultRef}, results)
	out := buf.String()
	for _, want := range []string{"| scenario | ns/op | calls/s | allocs/op | ratio |", "1.00× (ref)", "0.10×", "skipped (-short)", `boom \| bang`} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if ref := applyReference(results, "^nope$"); ref != "" {
		t.Fatalf("unexpected reference %q", ref)
	}
}

// checkNoChildren fails t if this process still has a child process: every
// row must reap what it started (the unix, shm and plugin children, knit's
// lane and spare processes). It reads /proc/self/task/*/children, which a
// kernel without CONFIG_PROC_CHILDREN lacks; the check is skipped there.
func checkNoChildren(t *testing.T) {
	t.Helper()
	files, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil || len(files) == 0 {
		t.Log("no /proc/self/task/*/children: child process check skipped")
		return
	}
	var pids []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		pids = append(pids, strings.Fields(string(data))...)
	}
	if len(pids) > 0 {
		t.Errorf("child processes left after the rows: %v", pids)
	}
}
