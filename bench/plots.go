//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// report is what -json prints and -plot-from reads back: everything the
// tables and the plots are made from.
type report struct {
	Meta    runMeta        `json:"meta"`
	Results []result       `json:"results"`
	Targets []targetResult `json:"targets"`
	// Rounds are the paired rounds the targets were judged by (-rounds).
	Rounds []pairRound `json:"rounds,omitempty"`
}

// readReport loads a report written by -json.
func readReport(path string) (report, error) {
	var r report
	data, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	if len(r.Results) == 0 {
		return r, fmt.Errorf("%s: no results", path)
	}
	return r, nil
}

// plotFormats are the file types -plot-format accepts (gonum/plot picks
// the encoder from the extension).
var plotFormats = map[string]bool{"svg": true, "png": true, "pdf": true}

// plotLine is one series: knit or a peer measured at several x.
type plotLine struct {
	label string
	rows  []*result // one per x; nil where not measured
}

// plotRef is a peer that has no x (a single row), drawn as a dashed
// horizontal line across the plot.
type plotRef struct {
	label string
	row   *result
}

// plotSpec describes one figure.
type plotSpec struct {
	file   string // base name, without extension
	title  string
	xLabel string
	yLabel string
	xs     []int
	// xNames, if set, labels xs (categories, on a linear axis) instead of
	// their numbers (on a log axis).
	xNames []string
	y      func(*result) float64
	lines  []plotLine
	refs   []plotRef
}

// writePlots draws the harness's plots from one run's results into dir, in
// format (svg, png or pdf). It returns the files written; a plot none of
// whose rows were measured (e.g. filtered out) is not written.
func writePlots(rep report, dir, format string) ([]string, error) {
	if !plotFormats[format] {
		return nil, fmt.Errorf("unknown plot format %q (want svg, png or pdf)", format)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	rs := rowSet(rep.Results)
	latencyUs := func(r *result) float64 { return r.NsPerOp / 1e3 }
	callsPerSec := func(r *result) float64 { return r.CallsPerSec }
	lanes := func(impl, shape string, window int) []*result {
		return rs.series(impl, shape, 0, window, true, laneSweep)
	}
	windows := func(impl string, n int) []*result {
		return rs.series(impl, shapeWindow, n, 0, false, windowSweep)
	}
	specs := []plotSpec{
		{
			file:   "latency-vs-lanes",
			title:  "Sequential call latency vs lane count (default Config)",
			xLabel: "lanes",
			yLabel: "latency per call, µs (log)",
			xs:     laneSweep,
			y:      latencyUs,
			lines: []plotLine{
				{"knit process lanes: sequential Call", lanes(implKnitProcess, shapeRoundTrip, 0)},
				{"knit goroutine lanes: sequential Call", lanes(implKnitGoroutine, shapeRoundTrip, 0)},
			},
			refs: []plotRef{
				{"unix socket child: round trip", rs.find(implUnixSocket, shapeRoundTrip, 1, 0)},
				{"shm spin child: round trip", rs.find(implShmSpin, shapeRoundTrip, 1, 0)},
				{"chan: unbuffered round trip", rs.find(implChanUnbuffered, shapeRoundTrip, 1, 0)},
			},
		},
		{
			file:   "throughput-vs-lanes",
			title:  fmt.Sprintf("Throughput vs lane count, window of %d futures (default Config)", inFlightTarget),
			xLabel: "lanes",
			yLabel: "calls/s (log)",
			xs:     laneSweep,
			y:      callsPerSec,
			lines: []plotLine{
				{"knit process lanes", lanes(implKnitProcess, shapeWindow, inFlightTarget)},
				{"knit goroutine lanes", lanes(implKnitGoroutine, shapeWindow, inFlightTarget)},
			},
			refs: []plotRef{
				{fmt.Sprintf("unix socket child: window %d", inFlightTarget), rs.find(implUnixSocket, shapeWindow, 1, inFlightTarget)},
				{fmt.Sprintf("chan pool of %d: window %d", poolWorkers, inFlightTarget), rs.find(implChanPool, shapeWindow, poolWorkers, inFlightTarget)},
			},
		},
		{
			file:   "throughput-vs-window",
			title:  "Throughput vs in-flight window, one goroutine (default Config)",
			xLabel: "calls in flight (window)",
			yLabel: "calls/s (log)",
			xs:     windowSweep,
			y:      callsPerSec,
			lines: []plotLine{
				{fmt.Sprintf("knit goroutine, %d lanes", poolWorkers), windows(implKnitGoroutine, poolWorkers)},
				{fmt.Sprintf("knit process, %d lanes", poolWorkers), windows(implKnitProcess, poolWorkers)},
				{fmt.Sprintf("chan pool, %d workers", poolWorkers), windows(implChanPool, poolWorkers)},
				{"unix socket child", windows(implUnixSocket, 1)},
			},
		},
	}
	specs = append(specs, loadPlots(rs, latencyUs, callsPerSec)...)
	var files []string
	for _, s := range specs {
		p, ok, err := s.draw(rep.Meta)
		if err != nil {
			return files, fmt.Errorf("%s: %w", s.file, err)
		}
		if !ok {
			continue
		}
		path := filepath.Join(dir, s.file+"."+format)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return files, fmt.Errorf("%s: %w", s.file, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// draw builds the plot; ok is false when no series has a point.
func (s plotSpec) draw(m runMeta) (p *plot.Plot, ok bool, err error) {
	p = plot.New()
	p.Title.Text = s.title + "\n" + runCaption(m)
	p.X.Label.Text = s.xLabel
	p.Y.Label.Text = s.yLabel
	p.X.Scale = plot.LogScale{}
	p.Y.Scale = plot.LogScale{}
	var xt plot.ConstantTicks
	for i, x := range s.xs {
		label := strconv.Itoa(x)
		if s.xNames != nil {
			label = s.xNames[i]
		}
		xt = append(xt, plot.Tick{Value: float64(x), Label: label})
	}
	if s.xNames != nil {
		p.X.Scale = plot.LinearScale{}
		p.X.Min, p.X.Max = float64(s.xs[0])-0.3, float64(s.xs[len(s.xs)-1])+0.3
	}
	p.X.Tick.Marker = xt
	p.Y.Tick.Marker = siLogTicks{}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())

	lo, hi := float64(s.xs[0]), float64(s.xs[len(s.xs)-1])
	yMin, yMax, entries := math.Inf(1), math.Inf(-1), 0
	seeY := func(y float64) {
		yMin, yMax, entries = math.Min(yMin, y), math.Max(yMax, y), entries+1
	}
	for i, l := range s.lines {
		var pts plotter.XYs
		for j, r := range l.rows {
			if r != nil {
				if y := s.y(r); y > 0 && !math.IsInf(y, 0) {
					pts = append(pts, plotter.XY{X: float64(s.xs[j]), Y: y})
					yMin, yMax = math.Min(yMin, y), math.Max(yMax, y)
				}
			}
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, false, err
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(l.label, line, points)
		entries++
		ok = true
	}
	if !ok {
		return nil, false, nil
	}
	for i, ref := range s.refs {
		if ref.row == nil {
			continue
		}
		y := s.y(ref.row)
		if y <= 0 || math.IsInf(y, 0) {
			continue
		}
		seeY(y)
		line, err := plotter.NewLine(plotter.XYs{{X: lo, Y: y}, {X: hi, Y: y}})
		if err != nil {
			return nil, false, err
		}
		line.Color = color.Gray{Y: uint8(60 + 50*i)}
		line.Dashes = plotutil.Dashes(i + 1)
		p.Add(line)
		p.Legend.Add(ref.label, line)
	}
	// The legend sits inside the plot, top left: widen the log range
	// upwards so the data stays below it.
	span := math.Log10(yMax / yMin)
	if span < 0.3 {
		span = 0.3
	}
	legend := math.Min(0.6, 0.05+0.075*float64(entries)) // share of the height the legend takes
	// The bottom is a power of ten, so the lowest tick is labelled.
	p.Y.Min = math.Pow(10, math.Floor(math.Log10(yMin/math.Pow(10, 0.05*span))))
	p.Y.Max = yMax * math.Pow(10, span*legend/(1-legend))
	return p, true, nil
}

// runCaption names the run a plot comes from: its figures are only
// comparable with each other.
func runCaption(m runMeta) string {
	return fmt.Sprintf("%s %s/%s, %d CPUs, benchtime %s, started %s, load %.2f→%.2f",
		m.GoVersion, m.GOOS, m.GOARCH, m.NumCPU, m.Benchtime, m.Started, m.LoadAvg[0], m.LoadAvg[1])
}

// siLogTicks marks a log axis at every power of ten (labelled 1, 10, 100,
// 1k, … or 0.1, 0.01) with unlabelled minor ticks at 2–9 times it.
type siLogTicks struct{}

// A range narrower than about two decades also labels 2× and 5×, and one
// with no such tick in it labels every tick, so an axis always has labels.
func (siLogTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= 0 {
		return nil
	}
	narrow := hi/lo < 100
	var ticks []plot.Tick
	labelled := 0
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		base := math.Pow(10, e)
		for i := 1; i < 10; i++ {
			v := base * float64(i)
			if v < lo/1.0001 || v > hi*1.0001 {
				continue
			}
			t := plot.Tick{Value: v}
			if i == 1 || (narrow && (i == 2 || i == 5)) {
				t.Label = siLabel(v)
				labelled++
			}
			ticks = append(ticks, t)
		}
	}
	if labelled == 0 {
		for i := range ticks {
			ticks[i].Label = siLabel(ticks[i].Value)
		}
	}
	return ticks
}

func siLabel(v float64) string {
	switch {
	case v >= 1e9:
		return strconv.FormatFloat(v/1e9, 'g', -1, 64) + "G"
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', -1, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', -1, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
