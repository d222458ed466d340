package knit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/knitgo/knit"
)

// collected is one collection of a manual reader.
type collected struct {
	t  *testing.T
	rm metricdata.ResourceMetrics
}

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return collected{t: t, rm: rm}
}

// matches reports whether set has every attribute of want (key=value, values as fmt prints them).
func matches(set attribute.Set, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		v, ok := set.Value(attribute.Key(want[i]))
		if !ok || v.Emit() != want[i+1] {
			return false
		}
	}
	return true
}

// value is the sum of an int64 sum or gauge's points, or the total count of a histogram's,
// over the points whose attributes include attrs (key, value, key, value …).
func (c collected) value(name string, attrs ...string) int64 {
	c.t.Helper()
	var total int64
	for _, sm := range c.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if matches(p.Attributes, attrs) {
						total += p.Value
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if matches(p.Attributes, attrs) {
						total += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if matches(p.Attributes, attrs) {
						total += int64(p.Count)
					}
				}
			default:
				c.t.Fatalf("%s: data of type %T", name, m.Data)
			}
		}
	}
	// (an instrument that recorded nothing is not collected: 0)
	return total
}

// A known sequence — calls that succeed, calls that fail, a call that crashes its lane and
// the restart — comes out of the instruments and Stats with exact counts, on both runtimes.
func TestMetricsCountCallsCrashesAndRestarts(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		t.Run(rt.String(), func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			defer mp.Shutdown(context.Background())
			ev := newEvents()
			p := newPool(t, knit.Config{Lanes: 1, Runtime: rt, PanicCrashesLane: true, MeterProvider: mp, OnEvent: ev.on,
				LatencyWindow: 30 * time.Second})
			ctx := context.Background()
			const calls, futures, failures, after = 20, 5, 3, 2
			for i := range calls {
				if v, err := add.Call(ctx, p, [2]int64{int64(i), 1}); err != nil || v != int64(i)+1 {
					t.Fatalf("add: %v, %v", v, err)
				}
			}
			for range futures {
				if _, err := add.Go(ctx, p, [2]int64{1, 1}).Wait(); err != nil {
					t.Fatal(err)
				}
			}
			for range failures {
				if _, err := fail.Call(ctx, p, "no"); !errors.Is(err, knit.ErrTaskError) {
					t.Fatalf("fail: %v", err)
				}
			}
			if _, err := boom.Call(ctx, p, "crash"); !errors.Is(err, knit.ErrWorkerCrashed) {
				t.Fatalf("boom: %v, want WORKER_CRASHED", err)
			}
			ev.await(t, "ready after the restart", func(e knit.Event) bool {
				return e.Lane == 0 && e.Incarnation == 1 && e.To == knit.StateReady
			})
			for range after {
				if _, err := add.Call(ctx, p, [2]int64{1, 1}); err != nil {
					t.Fatal(err)
				}
			}

			c := collect(t, reader)
			for _, w := range []struct {
				name  string
				attrs []string
				want  int64
			}{
				{"knit.calls.started", []string{"knit.task", "test.add"}, calls + futures + after},
				{"knit.calls.started", []string{"knit.task", "test.fail"}, failures},
				{"knit.calls.started", []string{"knit.task", "test.panic"}, 1},
				{"knit.calls.finished", []string{"knit.task", "test.add", "knit.outcome", "OK"}, calls + futures + after},
				{"knit.calls.finished", []string{"knit.task", "test.add"}, calls + futures + after},
				{"knit.calls.finished", []string{"knit.task", "test.fail", "knit.outcome", "TASK_ERROR"}, failures},
				{"knit.calls.finished", []string{"knit.task", "test.panic", "knit.outcome", "WORKER_CRASHED"}, 1},
				{"knit.call.duration", []string{"knit.task", "test.add", "knit.outcome", "OK"}, calls + futures + after},
				{"knit.call.duration", []string{"knit.task", "test.panic", "knit.outcome", "WORKER_CRASHED"}, 1},
				// run and wait: every call whose lane reported its run (not the crashed one)
				{"knit.call.run.duration", []string{"knit.task", "test.add"}, calls + futures + after},
				{"knit.call.wait.duration", []string{"knit.task", "test.fail"}, failures},
				{"knit.call.run.duration", nil, calls + futures + after + failures},
				{"knit.lane.crashes", []string{"knit.lane", "0", "knit.code", "WORKER_CRASHED"}, 1},
				{"knit.lane.restarts", []string{"knit.lane", "0", "knit.code", "WORKER_CRASHED"}, 1},
				{"knit.lane.state", []string{"knit.lane", "0", "knit.lane.state", "ready"}, 1},
				{"knit.lane.state", []string{"knit.lane", "0"}, 1}, // one state at a time
				{"knit.lane.calls.inflight", []string{"knit.lane", "0"}, 0},
				{"knit.lane.calls.queued", []string{"knit.lane", "0"}, 0},
				{"knit.lane.stop.timeouts", nil, 0},
				{"knit.lane.recycles", nil, 0},
			} {
				if got := c.value(w.name, w.attrs...); got != w.want {
					t.Errorf("%s%v = %d, want %d", w.name, w.attrs, got, w.want)
				}
			}

			s := p.Stats()
			l := s.Lanes[0]
			if l.Incarnation != 1 || l.Restarts != 1 || l.Crashes != 1 || l.Completed != after || l.Failed != 0 ||
				l.TotalCompleted != calls+futures+after || l.TotalFailed != failures+1 { // and the crashed call
				t.Errorf("lane stats %+v", l)
			}
			if s.TotalFailed != failures+1 || s.Failures[knit.CodeTaskError] != failures || s.Failures[knit.CodeWorkerCrashed] != 1 {
				t.Errorf("pool failures %d %v, want %d TASK_ERROR and 1 WORKER_CRASHED", s.TotalFailed, s.Failures, failures)
			}
			var addStats *knit.TaskStats
			for i := range s.Tasks {
				if s.Tasks[i].Task == "test.add" {
					addStats = &s.Tasks[i]
				}
			}
			if addStats == nil {
				t.Fatalf("no latency for test.add in %+v", s.Tasks)
			}
			if a := *addStats; a.Calls != calls+futures+after || a.P50 <= 0 || a.P50 > a.P90 || a.P90 > a.P99 || a.P99 > a.Max || a.Window != 30*time.Second {
				t.Errorf("test.add latency %+v", a)
			}
		})
	}
}

// Stopping a pool whose lane ignores its stop request counts the timeout (a counter: still
// reported once the pool is closed).
func TestMetricsCountStopTimeouts(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	p, err := knit.NewPool(knit.Config{Lanes: 1, MeterProvider: mp, StopAckTimeout: time.Millisecond}, block)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate()
	f := block.Go(context.Background(), p, g)
	<-g.started
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Close does not wait for the call: the lane is asked to stop while it runs
	if err := p.Close(ctx); !errors.Is(err, knit.ErrThreadClosed) {
		t.Fatalf("Close: %v, want the unacknowledged stop", err)
	}
	if _, err := f.Wait(); !errors.Is(err, knit.ErrThreadClosed) {
		t.Fatalf("call: %v", err)
	}
	close(g.open) // the abandoned lane's goroutine returns
	c := collect(t, reader)
	if got := c.value("knit.lane.stop.timeouts", "knit.lane", "0"); got != 1 {
		t.Errorf("stop timeouts %d, want 1", got)
	}
}

// A call refused before it has a record (its context had ended) counts as started and
// finished; once the pool is closed, its instruments are no longer reported.
func TestMetricsCountRejectedCalls(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	p, err := knit.NewPool(knit.Config{Lanes: 1, MeterProvider: mp}, add)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := add.Call(ctx, p, [2]int64{}); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	c := collect(t, reader)
	if s, f := c.value("knit.calls.started", "knit.task", "test.add"), c.value("knit.calls.finished", "knit.outcome", "CANCELED"); s != 1 || f != 1 {
		t.Errorf("started %d finished CANCELED %d, want 1 1", s, f)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := collect(t, reader); c.value("knit.calls.started") != 0 || c.value("knit.lane.state") != 0 {
		t.Errorf("a closed pool is still reported")
	}
}

// TestMetricsCallDoesNotAllocate: a call costs no allocation by default, with the no-op meter
// provider, with latency quantiles, and with the OTel SDK recording every instrument.
func TestMetricsCallDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("allocation counts are only meaningful without -race and -cover")
	}
	for _, tc := range []struct {
		name string
		cfg  func() knit.Config
	}{
		{"default", func() knit.Config { return knit.Config{} }},
		{"noop", func() knit.Config { return knit.Config{MeterProvider: noop.NewMeterProvider()} }},
		{"quantiles", func() knit.Config { return knit.Config{LatencyWindow: time.Minute} }},
		{"sdk", func() knit.Config {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
			return knit.Config{MeterProvider: mp}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
				cfg := tc.cfg()
				cfg.Lanes, cfg.Runtime = 1, rt
				p := newPool(t, cfg)
				ctx := context.Background()
				var failures atomic.Int32
				allocs := testing.AllocsPerRun(10_000, func() {
					if _, err := add.Call(ctx, p, [2]int64{1, 2}); err != nil {
						failures.Add(1)
					}
				})
				if failures.Load() != 0 || allocs != 0 {
					t.Fatalf("%v: %v allocs per call (%d failures), want 0", rt, allocs, failures.Load())
				}
			}
		})
	}
}

// A call past its HardTimeout gets its process lane killed: one kill, one crash.
func TestMetricsCountKills(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	ev := newEvents()
	p, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: knit.Process, MeterProvider: mp, OnEvent: ev.on}, hardStall)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if _, err := hardStall.Call(context.Background(), p, 0); !errors.Is(err, knit.ErrTimeout) {
		t.Fatalf("call: %v, want TIMEOUT", err)
	}
	ev.await(t, "ready after the kill", func(e knit.Event) bool { return e.Incarnation == 1 && e.To == knit.StateReady })
	c := collect(t, reader)
	if got := c.value("knit.lane.kills", "knit.lane", "0", "knit.signal", "SIGKILL", "knit.reason", "hard_timeout"); got != 1 {
		t.Errorf("hard-timeout kills %d, want 1", got)
	}
	if got := c.value("knit.lane.crashes", "knit.lane", "0"); got != 1 {
		t.Errorf("crashes %d, want 1", got)
	}
	if got := c.value("knit.calls.finished", "knit.task", "test.metrics.hardstall", "knit.outcome", "TIMEOUT"); got != 1 {
		t.Errorf("finished TIMEOUT %d, want 1", got)
	}
}

// By default a pool keeps no latency quantiles (calls are not timed); with LatencyWindow it
// does, without a meter provider.
func TestLatencyQuantilesOnlyWhenAsked(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1})
	if _, err := add.Call(context.Background(), p, [2]int64{1, 1}); err != nil {
		t.Fatal(err)
	}
	if tasks := p.Stats().Tasks; len(tasks) != 0 {
		t.Errorf("default pool has quantiles: %+v", tasks)
	}
	p = newPool(t, knit.Config{Lanes: 1, LatencyWindow: time.Minute})
	for range 10 {
		if _, err := add.Call(context.Background(), p, [2]int64{1, 1}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ts := range p.Stats().Tasks {
		if ts.Task == "test.add" && (ts.Calls != 10 || ts.Max <= 0 || ts.Window != time.Minute) {
			t.Errorf("test.add %+v, want 10 calls", ts)
		}
		if ts.Task != "test.add" && ts.Calls != 0 {
			t.Errorf("%+v, want no calls", ts)
		}
	}
}
