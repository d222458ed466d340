//go:build linux

package main

import (
	"bytes"
	"flag"
	"github.com/knitgo/knit"
	"os"
	"strings"
	"testing"
)

// TestMain lets the test binary act as the child process too: the process
// rows re-execute os.Executable(), which under go test is this binary.
func TestMain(m *testing.M) {
	knit.Main()
	if code, isChild := runChildIfRequested(); isChild {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestScenariosOnce runs every row once with a small fixed count
// (benchtime 2048x: enough to overflow the 1024-call window of the
// throughput rows), skipping the rows that -short skips, so `go test ./...`
// checks that each scenario, child processes included, works and cleans up.
func TestScenariosOnce(t *testing.T) {
	old := flag.Lookup("test.benchtime").Value.String()
	if err := flag.Set("test.benchtime", "2048x"); err != nil {
		t.Fatal(err)
	}
	defer flag.Set("test.benchtime", old)

	all := allScenarios()
	checkNames(all)
	for _, s := range all {
		t.Run(s.name, func(t *testing.T) {
			if s.slow {
				t.Skip("slow row; skipped as with -short")
			}
			r := runScenario(s)
			if r.Err != "" {
				t.Fatal(r.Err)
			}
			if r.N < 1 || r.NsPerOp <= 0 {
				t.Fatalf("no measurement: %+v", r)
			}
		})
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
