//go:build linux

// Command bench is the peer-comparison harness for knit: it measures
// baselines (direct calls, channels, goroutine pools, actors, child
// processes over unix sockets, shared memory and futexes, go-plugin) and
// knit's own lanes (see knit.go and knit_sweep.go), all with
// testing.Benchmark in one run, and prints a markdown table followed by
// issue 9's targets, each judged from two rows of that run (targets.go).
// With -plots it draws latency and throughput plots from the same rows
// (plots.go), also from a saved -json report (-plot-from).
//
//	cd bench && go run .          # full run
//	cd bench && go run . -short   # quick run, slow rows skipped
//
// The same binary is re-executed as the child process of the process rows;
// KNIT_BENCH_CHILD selects the child's role (see child.go).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"github.com/knitgo/knit"
	"github.com/panjf2000/ants/v2"
	"io"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// defaultRef is the reference row for the ratio column: an unbuffered
// channel hand-off to another goroutine, the cheapest cross-goroutine
// request/reply in plain Go.
const defaultRef = "chan: unbuffered round trip"

func main() {
	quietPeers()
	knit.Main() // a knit process lane re-executes this binary: serve and exit
	if code, isChild := runChildIfRequested(); isChild {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	filter     *regexp.Regexp
	short      bool
	json       bool
	ref        string
	benchtime  time.Duration
	idle       time.Duration
	plots      string // directory for the plots, "" for none
	plotFrom   string // a -json report to render instead of running
	plotFormat string
	rounds     int // paired rounds of each target's two rows (rounds.go)
	interleave int // slices a round-trip pair alternates in, per round (0: back to back)
	latency    int // -remote-latency: calls of the latency probe (latency.go; 0: off)
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	filter := fs.String("filter", "", "run only scenarios whose name matches this `regexp`")
	short := fs.Bool("short", false, "shorter runs (benchtime 100ms unless -benchtime is given) and skip the slowest rows")
	asJSON := fs.Bool("json", false, "print JSON instead of a markdown table")
	ref := fs.String("ref", defaultRef, "reference row for the ratio column: exact name, else first row matching this `regexp`")
	benchtime := fs.Duration("benchtime", 0, "target measuring time per row (default 1s, 100ms with -short)")
	idle := fs.Duration("idle", time.Second, "how long the idle rows watch an idle pool")
	plots := fs.String("plots", "", "write the plots (latency and throughput vs lanes, throughput vs window) into this `directory`")
	plotFrom := fs.String("plot-from", "", "do not run: read this `file` (written by -json) and print its tables (and, with -plots, draw its plots)")
	plotFormat := fs.String("plot-format", "svg", "file type of the plots: svg, png or pdf")
	rounds := fs.Int("rounds", 3, "after the main pass, measure each target's two rows back to back this many `times` and judge the target by the median ratio (0: judge the main pass)")
	interleave := fs.Int("interleave", 0, "in each paired round, run a round-trip target's two rows (one call in flight, no load) set up together, taking turns this many `times` (0: one after the other)")
	latency := fs.Int("remote-latency", 0, "do not run the rows: time this many sequential `calls` each of knit's remote lane and protoactor's RequestFuture, in alternating turns, and print their distributions and the machine's CPU per call")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run . [flags]\n\nScenarios:\n")
		for _, s := range allScenarios() {
			slow := ""
			if s.slow {
				slow = "  (skipped with -short)"
			}
			fmt.Fprintf(fs.Output(), "  %s%s\n", s.name, slow)
		}
		fmt.Fprintf(fs.Output(), "\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	o := options{short: *short, json: *asJSON, ref: *ref, benchtime: *benchtime, idle: *idle,
		plots: *plots, plotFrom: *plotFrom, plotFormat: *plotFormat, rounds: *rounds, interleave: *interleave, latency: *latency}
	if !plotFormats[o.plotFormat] {
		return options{}, fmt.Errorf("-plot-format %q: want svg, png or pdf", o.plotFormat)
	}
	if o.plotFrom != "" && *filter != "" {
		return options{}, fmt.Errorf("-filter does not apply to -plot-from")
	}
	if *filter != "" {
		re, err := regexp.Compile(*filter)
		if err != nil {
			return options{}, fmt.Errorf("-filter: %w", err)
		}
		o.filter = re
	}
	if o.benchtime == 0 {
		o.benchtime = time.Second
		if o.short {
			o.benchtime = 100 * time.Millisecond
		}
	}
	if o.benchtime < 0 {
		return options{}, fmt.Errorf("-benchtime must be positive")
	}
	if o.idle <= 0 {
		return options{}, fmt.Errorf("-idle must be positive")
	}
	if o.latency < 0 {
		return options{}, fmt.Errorf("-remote-latency must not be negative")
	}
	if o.interleave < 0 {
		return options{}, fmt.Errorf("-interleave must not be negative")
	}
	if o.rounds < 0 {
		return options{}, fmt.Errorf("-rounds must not be negative")
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if err == flag.ErrHelp {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	if opts.plotFrom != "" {
		return render(opts, stdout, stderr)
	}
	if opts.latency > 0 {
		if err := remoteLatency(opts.latency, stdout); err != nil {
			fmt.Fprintln(stderr, "remote latency:", err)
			return 1
		}
		return 0
	}
	idleWindow = opts.idle
	defer removeBenchTLS()
	// testing.Benchmark reads its target duration from the testing
	// package's -test.benchtime flag; register it and set it.
	testing.Init()
	if err := flag.Set("test.benchtime", opts.benchtime.String()); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}

	all := allScenarios()
	checkNames(all)
	start := time.Now()
	loadStart := loadAvg()
	if loadStart > 1 {
		fmt.Fprintf(stderr, "bench: warning: 1-minute load average is %.2f; other processes compete for the CPUs and distort the figures (spin rows most)\n", loadStart)
	}
	var results []result
	for _, s := range all {
		if opts.filter != nil && !opts.filter.MatchString(s.name) {
			continue
		}
		if opts.short && s.slow {
			results = append(results, result{Name: s.name, InFlight: s.inFlight, Skipped: "-short"})
			continue
		}
		fmt.Fprintf(stderr, "running %-55s ", s.name)
		t0 := time.Now()
		r := runScenario(s)
		if r.Err != "" {
			fmt.Fprintf(stderr, "ERROR after %v: %s\n", time.Since(t0).Round(time.Millisecond), r.Err)
		} else {
			fmt.Fprintf(stderr, "%v\n", time.Since(t0).Round(time.Millisecond))
		}
		results = append(results, r)
	}
	targets := computeTargets(results)
	var rounds []pairRound
	roundFailed := false
	if opts.rounds > 0 {
		rounds = measurePairs(targetPairs(targets), all, opts.rounds, opts.interleave, opts.benchtime, stderr)
		for _, r := range rounds {
			if r.A.Err != "" || r.B.Err != "" {
				roundFailed = true
				fmt.Fprintf(stderr, "bench: paired round %s ÷ %s: %s%s\n", r.Row, r.Against, r.A.Err, r.B.Err)
			}
		}
		applyRounds(targets, rounds)
	}
	refName := applyReference(results, opts.ref)
	meta := runMeta{
		GoVersion:  runtime.Version(),
		GOOS:       runtime.GOOS,
		GOARCH:     runtime.GOARCH,
		NumCPU:     runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Benchtime:  opts.benchtime.String(),
		IdleWindow: opts.idle.String(),
		Short:      opts.short,
		Reference:  refName,
		Started:    start.UTC().Format(time.RFC3339),
		Elapsed:    time.Since(start).Round(time.Millisecond).String(),
		LoadAvg:    [2]float64{loadStart, loadAvg()},
	}
	code := output(report{Meta: meta, Results: results, Targets: targets, Rounds: rounds}, opts, stdout, stderr)
	for _, r := range results {
		if r.Err != "" {
			code = 1
		}
	}
	if roundFailed {
		code = 1
	}
	return code
}

// render is -plot-from: the tables and plots of a saved run. The targets
// are computed again from its rows, so a report from an older harness gets
// the current targets.
func render(opts options, stdout, stderr io.Writer) int {
	rep, err := readReport(opts.plotFrom)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	rep.Targets = computeTargets(rep.Results)
	applyRounds(rep.Targets, rep.Rounds)
	return output(rep, opts, stdout, stderr)
}

// output prints rep as JSON or as the two tables, and draws the plots if
// -plots asks for them.
func output(rep report, opts options, stdout, stderr io.Writer) int {
	if opts.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
	} else {
		writeTable(stdout, rep.Meta, rep.Results)
		writeFastLatency(stdout, rep.Results)
		writeTargets(stdout, rep.Targets)
	}
	if opts.plots != "" {
		files, err := writePlots(rep, opts.plots, opts.plotFormat)
		for _, f := range files {
			fmt.Fprintln(stderr, "wrote", f)
		}
		if err != nil {
			fmt.Fprintln(stderr, "bench: plots:", err)
			return 1
		}
		if len(files) == 0 {
			fmt.Fprintln(stderr, "bench: no plot written: none of their rows was measured")
		}
	}
	return 0
}

type runMeta struct {
	GoVersion  string `json:"go_version"`
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Benchtime  string `json:"benchtime"`
	IdleWindow string `json:"idle_window,omitempty"` // -idle
	Short      bool   `json:"short"`
	Reference  string `json:"reference"`
	Started    string `json:"started"`
	Elapsed    string `json:"elapsed"`
	// LoadAvg is /proc/loadavg's 1-minute figure at the start and the end
	// of the run: other busy processes distort every row, spin rows most.
	LoadAvg [2]float64 `json:"loadavg_1m"`
}

// applyReference picks the reference row (exact name first, else the first
// row whose name matches ref as a regexp) and fills in every ratio. It
// returns the reference row's name, or "" if none was measured.
func applyReference(results []result, ref string) string {
	idx := -1
	for i, r := range results {
		if r.Name == ref && r.NsPerOp > 0 {
			idx = i
			break
		}
	}
	if idx < 0 {
		if re, err := regexp.Compile(ref); err == nil {
			for i, r := range results {
				if re.MatchString(r.Name) && r.NsPerOp > 0 {
					idx = i
					break
				}
			}
		}
	}
	if idx < 0 {
		return ""
	}
	refNs := results[idx].NsPerOp
	results[idx].Reference = true
	for i := range results {
		if results[i].NsPerOp > 0 {
			results[i].Ratio = results[i].NsPerOp / refNs
		}
	}
	return results[idx].Name
}

func writeTable(w io.Writer, m runMeta, results []result) {
	ratioNote := fmt.Sprintf("Ratio = ns/op ÷ ns/op of %q.", m.Reference)
	if m.Reference == "" {
		ratioNote = "No ratio: the reference row was not measured (see -ref)."
	}
	fmt.Fprintf(w, "%s %s/%s, %d CPUs, GOMAXPROCS=%d, benchtime %s per row, run took %s, load average %.2f → %.2f. %s\n\n",
		m.GoVersion, m.GOOS, m.GOARCH, m.NumCPU, m.GOMAXPROCS, m.Benchtime, m.Elapsed, m.LoadAvg[0], m.LoadAvg[1], ratioNote)
	fmt.Fprintln(w, "| scenario | ns/op | calls/s | allocs/op | ratio |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
	for _, r := range results {
		switch {
		case r.Skipped != "":
			fmt.Fprintf(w, "| %s | skipped (%s) | | | |\n", r.Name, r.Skipped)
		case r.Err != "":
			fmt.Fprintf(w, "| %s | error: %s | | | |\n", r.Name, strings.ReplaceAll(r.Err, "|", `\|`))
		case r.Idle != nil:
			fmt.Fprintf(w, "| %s | idle: %.2f%% of a core over %s (host %.2f%%, lanes and spares %.2f%%) | | | |\n",
				r.Name, r.Idle.CPUPercent, fmtWindow(r.Idle.WindowNs), r.Idle.HostPercent, r.Idle.LanesPercent)
		default:
			ratio := "—"
			if r.Ratio > 0 {
				ratio = fmtRatio(r.Ratio)
				if r.Reference {
					ratio = "1.00× (ref)"
				}
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", r.Name, fmtNs(r.NsPerOp), fmtSI(r.CallsPerSec), fmtAllocs(r.AllocsPerOp), ratio)
		}
	}
}

// loadAvg returns the 1-minute load average, or -1 if unknown.
func loadAvg() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return -1
	}
	return v
}

func fmtNs(ns float64) string {
	switch {
	case ns < 10:
		return fmt.Sprintf("%.2f", ns)
	case ns < 100:
		return fmt.Sprintf("%.1f", ns)
	default:
		return fmt.Sprintf("%.0f", ns)
	}
}

func fmtSI(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

func fmtRatio(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.1f×", x)
	case x >= 0.1:
		return fmt.Sprintf("%.2f×", x)
	default:
		return fmt.Sprintf("%.2g×", x)
	}
}

func fmtAllocs(a float64) string {
	switch {
	case a == float64(int64(a)):
		return fmt.Sprintf("%d", int64(a))
	case a < 0.001:
		return "<0.001"
	case a < 1:
		return fmt.Sprintf("%.2g", a)
	case a < 10:
		return fmt.Sprintf("%.2f", a)
	default:
		return fmt.Sprintf("%.1f", a)
	}
}

// quietPeers stops what the peer libraries start at package init: ants makes a default pool
// with a 500 ms and a 1 s ticker, which the harness never uses (its rows make pools of their
// own). Every process of this binary had them, knit's lane and spare processes too (they are
// this binary re-executed), so the idle rows billed three wake-ups a second in each of six
// processes to knit. It runs first in every role.
func quietPeers() { ants.Release() }
