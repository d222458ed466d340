package knit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit"
)

// Supervision benchmarks (docs/benchmarks.md, "Supervision"):
//
//	BenchmarkSupervisionCallPath/{goroutine,process}/{supervised,unsupervised}
//	    a sequential Task.Call round trip (int64, 1 lane, no spinning) on a pool under its
//	    supervision tree (knit.NewPool) and on the same pool without one
//	    (knit.NewUnsupervisedPool, export_test.go)
//	BenchmarkSupervisionCallPath/{goroutine,process}/alternating
//	    both pools in one benchmark, 1000 calls on one then 1000 on the other, so that drift
//	    on a shared machine hits both alike; reports sup-ns/call and unsup-ns/call
//	BenchmarkRestart/lanes={1,2}/spares={0,1}/backoff={none,1ms}
//	    SIGKILL a process lane, then time until the restarted lane serves a call again;
//	    without spare processes (Process.Spares -1) and with one (the default)
//	BenchmarkRestartTrace/lanes=1/spares={0,1}/backoff=none
//	    the same with the lifecycle debug logs on, to split the new incarnation's boot
//
// The restart benchmarks report percentiles (nearest rank) of per-iteration durations; run
// them with a fixed count, e.g. -benchtime 30x.

// BenchmarkSupervisionCallPath: what the supervision tree costs a call. Nothing should show:
// the tree is never on the call path (dispatch reads the lanes' atomic pointers).
func BenchmarkSupervisionCallPath(b *testing.B) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		cfg := knit.Config{Lanes: 1, Runtime: rt}
		if rt == knit.Process {
			cfg.LaneSpin = -1 // process lanes spin 50µs by default; no spinning here
		}
		b.Run(rt.String(), func(b *testing.B) {
			b.Run("supervised", func(b *testing.B) { benchSupCall(b, cfg, true) })
			b.Run("unsupervised", func(b *testing.B) { benchSupCall(b, cfg, false) })
			b.Run("alternating", func(b *testing.B) { benchSupAlternating(b, cfg) })
		})
	}
}

// supBenchPool is benchPool with the choice of a supervision tree.
func supBenchPool(b *testing.B, cfg knit.Config, supervised bool) (*knit.Pool, func(error) string) {
	b.Helper()
	if supervised {
		return benchPool(b, cfg)
	}
	p, err := knit.NewUnsupervisedPool(cfg, benchInt, benchBytes)
	if err != nil {
		b.Fatal(err)
	}
	return watched(b, p)
}

func benchSupCall(b *testing.B, cfg knit.Config, supervised bool) {
	p, stalled := supBenchPool(b, cfg, supervised)
	knit.AwaitSpares(p) // a supervised process pool starts a spare process: not while timing
	ctx := context.Background()
	for n := range inFlight { // warm up
		if _, err := benchInt.Call(ctx, p, int64(n)); err != nil {
			b.Fatal(stalled(err))
		}
	}
	m := startTimer(b)
	for n := range b.N {
		if v, err := benchInt.Call(ctx, p, int64(n)); err != nil || v != int64(n)+1 {
			b.Fatalf("call %d: %v, %s", n, v, stalled(err))
		}
	}
	m.stop(b, false)
}

// supAltBlock is how many calls the alternating benchmark makes on one pool before it
// switches to the other.
const supAltBlock = 1000

func benchSupAlternating(b *testing.B, cfg knit.Config) {
	sup, supStalled := supBenchPool(b, cfg, true)
	unsup, unsupStalled := supBenchPool(b, cfg, false)
	pools := [2]*knit.Pool{sup, unsup}
	stalled := [2]func(error) string{supStalled, unsupStalled}
	knit.AwaitSpares(sup)
	ctx := context.Background()
	for i, p := range pools {
		for n := range inFlight {
			if _, err := benchInt.Call(ctx, p, int64(n)); err != nil {
				b.Fatal(stalled[i](err))
			}
		}
	}
	var spent [2]time.Duration
	var calls [2]int
	m := startTimer(b)
	for done, which := 0, 0; done < b.N; which ^= 1 {
		k := min(supAltBlock, b.N-done)
		p := pools[which]
		start := time.Now()
		for n := done; n < done+k; n++ {
			if v, err := benchInt.Call(ctx, p, int64(n)); err != nil || v != int64(n)+1 {
				b.Fatalf("call %d: %v, %s", n, v, stalled[which](err))
			}
		}
		spent[which] += time.Since(start)
		calls[which] += k
		done += k
	}
	m.stop(b, false)
	for i, unit := range []string{"sup-ns/call", "unsup-ns/call"} {
		if calls[i] > 0 {
			b.ReportMetric(float64(spent[i].Nanoseconds())/float64(calls[i]), unit)
		}
	}
}

// BenchmarkRestart: SIGKILL a process lane and time how long until the restarted lane serves
// a call again. Each iteration kills one lane (lane i mod lanes) by the PID its Stats give and
// calls until a call has been served by the new incarnation: the first call may land on the
// dying lane and fail with WORKER_CRASHED (it is retried); a later one waits in dispatch for a
// ready lane. With 2 lanes the other lane serves meanwhile; the caller then blocks on the new
// incarnation's Ready event (it does not spin) and calls until the new incarnation has served.
//
// With spares=1 (Process.Spares default) the restart takes a spare process, exec'd and
// initialised ahead; the pool then starts a new spare, and the next iteration waits (untimed)
// until it has initialised, so every kill finds one waiting. spares=0 sets Spares -1: every
// restart spawns.
//
// The backoff stays at its minimum: Backoff.Reset of 1ns makes every kill the first restart
// in a row (with the default Reset, back-to-back kills would double the delay up to 2s),
// Jitter is off and MaxRestarts is -1.
//
// Metrics, per iteration (percentiles by nearest rank over the b.N iterations):
//
//	p50-ms, p90-ms          SIGKILL → a call served by the restarted lane returned
//	call-p50-ms             SIGKILL → the first call that succeeded (any lane)
//	crash-ready-p50-ms/-p90 Crashed event → Ready event of the new incarnation
//	kill-fail-p50-ms        SIGKILL → the first failed call returned (iterations with one)
//	kill-crash-p50-ms       SIGKILL → Crashed event (the host notices, settles, unmaps)
//	crash-boot-p50-ms       Crashed → Booting (supervisor decision, backoff, actor restart)
//	boot-ready-p50-ms       Booting → Ready (spawn, the lane's init, the boot handshake)
//	ready-served-p50-ms     Ready → the call served by the new incarnation returned (a new
//	                        incarnation takes calls before its Ready event is reported, so
//	                        this can be negative)
//	failed-calls/op         calls that failed (WORKER_CRASHED) before one succeeded
//	delay-ms                the backoff the supervisor announced (Restarting's Delay), mean
func BenchmarkRestart(b *testing.B) {
	for _, lanes := range []int{1, 2} {
		for _, spares := range []int{0, 1} {
			for _, bo := range supBackoffs {
				b.Run(fmt.Sprintf("lanes=%d/spares=%d/backoff=%s", lanes, spares, bo.name), func(b *testing.B) {
					benchRestart(b, lanes, spares, bo.min, false)
				})
			}
		}
	}
}

// BenchmarkRestartTrace: BenchmarkRestart with KNIT_DEBUG=lifecycle and a logger that keeps
// the host's "lane process started" and the lane's "lane booting" / "lane ready" entries, plus a task
// that returns when the lane's test binary initialised this package. It splits Booting →
// Ready (all wall-clock, one machine):
//
//	boot-spawn-p50-ms   Booting event → "lane process started": region and eventfd, then fork and
//	                    exec (spares=0) or the assignment message to a spare (spares=1)
//	spawn-main-p50-ms   → the lane logged "lane booting" in Serve: spares=0, the Go runtime
//	                    and package init of the test binary, then TestMain → knit.Main;
//	                    spares=1, the spare receiving its assignment
//	spawn-init-p50-ms   (spares=0) of which: → the lane's package knit_test initialised
//	main-ready-p50-ms   → the lane logged "lane ready" (map, check, mark ready)
//	ready-host-p50-ms   → the host's Ready event (doorbell, reaper, awaitReady, Open, actor)
func BenchmarkRestartTrace(b *testing.B) {
	for _, spares := range []int{0, 1} {
		b.Run(fmt.Sprintf("lanes=1/spares=%d/backoff=none", spares), func(b *testing.B) {
			benchRestart(b, 1, spares, -1, true)
		})
	}
}

var supBackoffs = []struct {
	name string
	min  time.Duration
}{{"none", -1}, {"1ms", 0}} // Backoff.Min: negative is no delay, zero the default 1ms

// supEvents keeps a pool's events for the restart benchmarks.
type supEvents struct {
	mu     sync.Mutex
	all    []knit.Event
	notify chan struct{}
}

func newSupEvents() *supEvents { return &supEvents{notify: make(chan struct{}, 1)} }

func (r *supEvents) record(e knit.Event) {
	r.mu.Lock()
	r.all = append(r.all, e)
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (r *supEvents) find(lane, inc int, to knit.State) (knit.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.all) - 1; i >= 0; i-- {
		if e := r.all[i]; e.Lane == lane && e.Incarnation == inc && e.To == to {
			return e, true
		}
	}
	return knit.Event{}, false
}

// await waits for an event; a bound far beyond any expected restart turns a restart that
// never comes into a failure listing the events.
func (r *supEvents) await(b *testing.B, lane, inc int, to knit.State) knit.Event {
	b.Helper()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		if e, ok := r.find(lane, inc, to); ok {
			return e
		}
		select {
		case <-r.notify:
		case <-timeout.C:
			r.mu.Lock()
			defer r.mu.Unlock()
			b.Fatalf("no %v event of lane %d incarnation %d within 30s; events: %+v", to, lane, inc, r.all)
		}
	}
}

// supTrace is a zap core that keeps the lifecycle entries BenchmarkRestartTrace needs and
// drops everything else.
type supTrace struct {
	mu      sync.Mutex
	entries []supEntry
	notify  chan struct{}
}

type supEntry struct {
	msg       string
	at        time.Time // host time of the entry
	lane, inc int
	laneT     time.Duration // lane entries: lane time since the host's epoch
	hasLaneT  bool
}

func (t *supTrace) Enabled(zapcore.Level) bool        { return true }
func (t *supTrace) With([]zapcore.Field) zapcore.Core { return t }
func (t *supTrace) Sync() error                       { return nil }

func (t *supTrace) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	switch e.Message {
	case "lane process started", "lane booting", "lane ready":
		return ce.AddCore(e, t)
	}
	return ce
}

func (t *supTrace) Write(e zapcore.Entry, fields []zapcore.Field) error {
	s := supEntry{msg: e.Message, at: e.Time, lane: -1, inc: -1}
	for _, f := range fields {
		switch f.Key {
		case "lane":
			s.lane = int(f.Integer)
		case "incarnation":
			s.inc = int(f.Integer)
		case "lane_t":
			s.laneT, s.hasLaneT = time.Duration(f.Integer), true
		}
	}
	t.mu.Lock()
	t.entries = append(t.entries, s)
	t.mu.Unlock()
	select {
	case t.notify <- struct{}{}:
	default:
	}
	return nil
}

// await waits for an entry: the lane's lines reach the host through its stderr pipe. The
// host logs its own "lane booting" and "lane ready" for the events; fromLane picks the
// lane's (they carry lane_t).
func (t *supTrace) await(b *testing.B, msg string, lane, inc int, fromLane bool) supEntry {
	b.Helper()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		t.mu.Lock()
		for i := len(t.entries) - 1; i >= 0; i-- {
			if e := t.entries[i]; e.msg == msg && e.lane == lane && e.inc == inc && e.hasLaneT == fromLane {
				t.mu.Unlock()
				return e
			}
		}
		t.mu.Unlock()
		select {
		case <-t.notify:
		case <-timeout.C:
			b.Fatalf("no %q entry of lane %d incarnation %d within 30s", msg, lane, inc)
		}
	}
}

// supSamples collects one duration per iteration under a metric name.
type supSamples struct {
	order []string
	by    map[string][]time.Duration
}

func (s *supSamples) add(name string, d time.Duration) {
	if s.by == nil {
		s.by = map[string][]time.Duration{}
	}
	if _, ok := s.by[name]; !ok {
		s.order = append(s.order, name)
	}
	s.by[name] = append(s.by[name], d)
}

// pct is the nearest-rank percentile q (0 < q ≤ 1) of ds, in milliseconds.
func supPct(ds []time.Duration, q float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	i = max(0, min(i, len(s)-1))
	return float64(s[i].Nanoseconds()) / 1e6
}

func benchRestart(b *testing.B, lanes, spares int, backoffMin time.Duration, trace bool) {
	ev := newSupEvents()
	cfg := knit.Config{Lanes: lanes, Runtime: knit.Process, Logger: zap.NewNop(), OnEvent: ev.record,
		Restart: knit.Restart{MaxRestarts: -1,
			Backoff: knit.Backoff{Min: backoffMin, Jitter: -1, Reset: time.Nanosecond}}}
	cfg.Process.Spares = spares
	if spares == 0 {
		cfg.Process.Spares = -1 // zero is the default, 1
	}
	var tr *supTrace
	if trace {
		b.Setenv("KNIT_DEBUG", "lifecycle") // the lanes log "lane booting" and "lane ready"
		tr = &supTrace{notify: make(chan struct{}, 1)}
		cfg.Logger = zap.New(tr)
	}
	p, err := knit.NewPool(cfg, benchInt, supLaneTimesTask)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil {
			b.Error(err)
		}
	})
	ctx := context.Background()
	for n := range inFlight { // warm up
		if _, err := benchInt.Call(ctx, p, int64(n)); err != nil {
			b.Fatal(err)
		}
	}
	var samples supSamples
	failed := 0
	var delay time.Duration
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
	b.ReportAllocs()
	b.ResetTimer()
	b.StopTimer() // on only from each SIGKILL to the call served after it
	for i := range b.N {
		k := i % lanes
		knit.AwaitSpares(p)
		if got := len(p.Stats().Spares); got != max(spares, 0) {
			b.Fatalf("iteration %d: %d spares waiting, want %d", i, got, spares)
		}
		st := p.Stats().Lanes[k]
		if st.State != knit.StateReady || st.PID <= 0 {
			b.Fatalf("iteration %d: lane %d is not a ready process lane: %+v", i, k, st)
		}
		pid, inc := st.PID, st.Incarnation
		b.StartTimer()
		killed := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			b.Fatalf("kill %d: %v", pid, err)
		}
		var firstOK, firstFail, served time.Time
		for served.IsZero() {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			v, err := benchInt.Call(cctx, p, int64(i))
			end := time.Now()
			cancel()
			if err != nil {
				var ke *knit.Error
				if !errors.As(err, &ke) || ke.Code != knit.CodeWorkerCrashed {
					b.Fatalf("iteration %d: call after SIGKILL of lane %d (pid %d): %v", i, k, pid, err)
				}
				if failed++; firstFail.IsZero() {
					firstFail = end
				}
				continue
			}
			if v != int64(i)+1 {
				b.Fatalf("iteration %d: %d+1 = %d", i, i, v)
			}
			if firstOK.IsZero() {
				firstOK = end
			}
			if ls := p.Stats().Lanes[k]; ls.PID > 0 && ls.PID != pid && ls.Completed > 0 {
				served = end
				break
			}
			// Served by another lane (or by the dying one): wait for the new incarnation
			// without spinning, then call again.
			ev.await(b, k, inc+1, knit.StateReady)
		}
		b.StopTimer()
		crashed := ev.await(b, k, inc, knit.StateCrashed)
		restarting := ev.await(b, k, inc, knit.StateRestarting)
		booting := ev.await(b, k, inc+1, knit.StateBooting)
		ready := ev.await(b, k, inc+1, knit.StateReady)
		delay += restarting.Delay
		samples.add("p", served.Sub(killed))
		samples.add("call", firstOK.Sub(killed))
		samples.add("crash-ready", ready.Time.Sub(crashed.Time))
		samples.add("kill-crash", crashed.Time.Sub(killed))
		if !firstFail.IsZero() {
			samples.add("kill-fail", firstFail.Sub(killed))
		}
		samples.add("crash-boot", booting.Time.Sub(crashed.Time))
		samples.add("boot-ready", ready.Time.Sub(booting.Time))
		samples.add("ready-served", served.Sub(ready.Time))
		if trace {
			supTraceIteration(b, p, tr, &samples, k, inc+1, booting, ready)
		}
	}
	for _, name := range samples.order {
		ds := samples.by[name]
		switch name {
		case "p":
			b.ReportMetric(supPct(ds, 0.5), "p50-ms")
			b.ReportMetric(supPct(ds, 0.9), "p90-ms")
		case "crash-ready":
			b.ReportMetric(supPct(ds, 0.5), "crash-ready-p50-ms")
			b.ReportMetric(supPct(ds, 0.9), "crash-ready-p90-ms")
		default:
			b.ReportMetric(supPct(ds, 0.5), name+"-p50-ms")
		}
	}
	b.ReportMetric(float64(failed)/float64(b.N), "failed-calls/op")
	b.ReportMetric(ms(delay)/float64(b.N), "delay-ms")
}

// supTraceIteration splits one Booting → Ready of lane k, incarnation inc.
func supTraceIteration(b *testing.B, p *knit.Pool, tr *supTrace, samples *supSamples, k, inc int, booting, ready knit.Event) {
	b.Helper()
	var lt supLaneTimes
	for tries := 0; lt.Lane != k || lt.Incarnation != inc; tries++ {
		if tries == 100 {
			b.Fatalf("the lane times task never reached lane %d incarnation %d (last: %+v)", k, inc, lt)
		}
		var err error
		if lt, err = supLaneTimesTask.Call(context.Background(), p, 0); err != nil {
			b.Fatal(err)
		}
	}
	spawned := tr.await(b, "lane process started", k, inc, false)
	laneBooting := tr.await(b, "lane booting", k, inc, true)
	laneReady := tr.await(b, "lane ready", k, inc, true)
	// Wall clock throughout: the lane's entries are times since the host's epoch (UnixNano).
	wall := func(t time.Time) int64 { return t.UnixNano() }
	tBoot, tSpawn := wall(booting.Time), wall(spawned.at)
	tMain, tLaneReady := lt.Epoch+int64(laneBooting.laneT), lt.Epoch+int64(laneReady.laneT)
	tReady := wall(ready.Time)
	samples.add("boot-spawn", time.Duration(tSpawn-tBoot))
	samples.add("spawn-main", time.Duration(tMain-tSpawn))
	if lt.Init > tSpawn { // spawned for this incarnation, not a spare initialised earlier
		samples.add("spawn-init", time.Duration(lt.Init-tSpawn))
	}
	samples.add("main-ready", time.Duration(tLaneReady-tMain))
	samples.add("ready-host", time.Duration(tReady-tLaneReady))
}
