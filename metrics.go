package knit

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/internal/latency"
	"github.com/knitgo/knit/lifecycle"
)

// A pool's observation: cumulative counters per lane slot, and on request per-task latency
// windows for Stats (Config.LatencyWindow) and OpenTelemetry instruments
// (Config.MeterProvider; docs/operating.md lists them). With neither, a call pays one
// predictable branch. With either, it pays two monotonic clock reads (one vDSO call each:
// 30–33 ns on the reference VM, internal/latency's BenchmarkNow), and per call one atomic
// add into the task's histogram, or the instruments' recording, with attribute sets built
// beforehand so that nothing is allocated.

// meterName is the instrumentation scope of knit's instruments.
const meterName = "github.com/knitgo/knit"

// monoNow is the monitor's clock: monotonic, one vDSO call.
func monoNow() time.Duration { return latency.Now() }

// monitor is a pool's observation. A nil *monitor observes nothing (a pool built by a
// test harness).
type monitor struct {
	p     *Pool
	on    bool       // calls are timed: latency windows or instruments
	tasks []*taskObs // by registry index; nil for tasks the pool does not serve
	m     *meters    // nil: no meter provider, or the no-op one

	mu     sync.Mutex   // guards the growth of totals
	totals []*laneTotal // by lane slot, grown as lanes appear

	// failures counts failed calls by code: knownCodes' order, then every other code.
	failures [len(knownCodes) + 1]atomic.Uint64
}

// The monitor reads lane slots only through these two, so that it does not depend on how
// the pool holds them.

// monLanes is how many lane slots the pool has.
func (p *Pool) monLanes() int { return p.laneCount() }

// monLane is slot i's current incarnation (nil before its first start).
func (p *Pool) monLane(i int) *lane { return p.slots[i].cur.Load() }

// taskObs is one task's share.
type taskObs struct {
	def  actors.Def
	lat  *latency.Window // nil: no LatencyWindow
	attr *taskAttrs      // nil without instruments
}

// laneTotal is a lane slot's counters across incarnations.
type laneTotal struct {
	mu        sync.Mutex    // orders folding an incarnation in against Stats
	completed uint64        // by incarnations that have ended and been folded in
	failed    atomic.Uint64 // calls that failed with an error naming the slot (monitor.Failed)
	live      []*lane       // incarnations opened and not folded in yet: their counters still move
	lastEnd   Code          // the code of the slot's last end (crash, exit, failed start)
	crashes   atomic.Int64
}

// total is slot i's totals, made on first use.
func (o *monitor) total(i int) *laneTotal {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.totals) <= i {
		o.totals = append(o.totals, new(laneTotal))
	}
	return o.totals[i]
}

// opened counts l among its slot's incarnations from now on (it takes calls).
func (o *monitor) opened(l *lane) {
	if o == nil {
		return
	}
	t := o.total(l.Idx)
	t.mu.Lock()
	t.fold()
	t.live = append(t.live, l)
	t.mu.Unlock()
}

// fold adds the final counters of the live incarnations that have ended to the slot's
// totals, and drops them. t.mu is held.
func (t *laneTotal) fold() {
	kept := t.live[:0]
	for _, l := range t.live {
		if !isClosed(l.Ended()) { // (a process lane's counters are final once it is gone)
			kept = append(kept, l)
			continue
		}
		t.completed += l.Counters().Completed
	}
	clear(t.live[len(kept):])
	t.live = kept
}

func newMonitor(p *Pool) (*monitor, error) {
	if p.cfg.test.noMonitor {
		return nil, nil
	}
	o := &monitor{p: p, tasks: make([]*taskObs, len(p.byIndex))}
	window := p.cfg.LatencyWindow
	for _, d := range p.defs {
		t := &taskObs{def: d}
		if window > 0 {
			t.lat = latency.NewWindow(window)
		}
		o.tasks[d.Index()] = t
	}
	switch p.cfg.MeterProvider.(type) {
	case nil, noop.MeterProvider, *noop.MeterProvider:
	default:
		m, err := newMeters(p, o)
		if err != nil {
			return nil, &Error{Code: CodePoolUnavailable, Lane: -1, Message: "creating the pool's metric instruments", Cause: err}
		}
		o.m = m
	}
	o.on = window > 0 || o.m != nil
	return o, nil
}

// timed reports whether goroutine lanes time their calls: only the instruments split run
// from wait time.
func (o *monitor) timed() bool { return o != nil && o.m != nil }

// observe has r's settlement observed. It is on the call path.
func observe[In, Out any](p *Pool, r *actors.Record[In, Out], task uint32) {
	o := p.obs
	if o == nil {
		return
	}
	r.OnFail(o)
	if !o.on {
		return
	}
	r.Observe(o, int64(monoNow()))
	if o.m != nil {
		if t := o.tasks[task]; t != nil {
			t.attr.started.Add(1)
		}
	}
}

// rejected counts a call that failed before it had a record (the pool was closed, the
// context had ended): started and finished at once, with no duration.
func (o *monitor) rejected(task uint32, err error) {
	if o == nil {
		return
	}
	o.Failed(task, err)
	if o.m == nil || int(task) >= len(o.tasks) || o.tasks[task] == nil {
		return
	}
	t := o.tasks[task]
	t.attr.started.Add(1)
	t.attr.outcome(err).n.Add(1)
}

// Failed implements actors.FailObserver: the pool's count of failed calls by code, and the
// lane's whose end or task failed the call.
func (o *monitor) Failed(_ uint32, err error) {
	code, lane := codeOf(err)
	i := slices.Index(knownCodes[:], code)
	if i < 0 {
		i = len(knownCodes)
	}
	o.failures[i].Add(1)
	if lane >= 0 && lane < maxLanes {
		o.total(lane).failed.Add(1)
	}
}

// codeOf is the code of a call's error and the lane it names (-1: none).
func codeOf(err error) (Code, int) {
	if ke, ok := err.(*Error); ok {
		return ke.Code, ke.Lane
	}
	if ke := (*Error)(nil); errors.As(err, &ke) {
		return ke.Code, ke.Lane
	}
	if kc := coded(nil); errors.As(err, &kc) {
		return Code(kc.KnitCode()), -1
	}
	return Code(outcomeOther), -1
}

// failureCounts is the count of failed calls by code, and their sum.
func (o *monitor) failureCounts() (map[Code]uint64, uint64) {
	if o == nil {
		return nil, 0
	}
	out, total := map[Code]uint64{}, uint64(0)
	for i := range o.failures {
		n := o.failures[i].Load()
		if n == 0 {
			continue
		}
		code := Code(outcomeOther)
		if i < len(knownCodes) {
			code = knownCodes[i]
		}
		out[code] = n
		total += n
	}
	return out, total
}

// Settled implements actors.Observer.
func (o *monitor) Settled(task uint32, err error, begun int64, ran uint64) {
	if int(task) >= len(o.tasks) || o.tasks[task] == nil {
		return
	}
	t := o.tasks[task]
	now := monoNow()
	total := max(now-time.Duration(begun), 0)
	if t.lat != nil {
		t.lat.Record(now, total)
	}
	m := o.m
	if m == nil {
		return
	}
	ctx := context.Background()
	a := t.attr.outcome(err)
	a.n.Add(1)
	m.duration.Record(ctx, total.Seconds(), a.rec...)
	if ran != 0 { // the lane's report: never more than the whole call
		run := total
		if ran < uint64(total) {
			run = time.Duration(ran)
		}
		m.run.Record(ctx, run.Seconds(), t.attr.rec...)
		m.wait.Record(ctx, (total - run).Seconds(), t.attr.rec...)
	}
}

// event counts a lifecycle transition: crashes per slot, and the instruments' restarts,
// crashes and recycles.
func (o *monitor) event(e Event) {
	if o == nil || e.Lane < 0 {
		return
	}
	t := o.total(e.Lane)
	code := e.Code
	t.mu.Lock()
	switch e.To {
	case StateCrashed, StateExited, StateStartupFailed:
		t.lastEnd = code
	case StateRestarting, StateCrashLoopBackoff:
		if code == "" { // a restart is counted by the code of the end that caused it
			code = t.lastEnd
		}
	}
	t.mu.Unlock()
	crash := e.To == StateCrashed
	if crash {
		t.crashes.Add(1)
	}
	m := o.m
	if m == nil {
		return
	}
	var c metric.Int64Counter
	switch {
	case crash:
		c = m.crashes
	case e.To == StateRestarting || e.To == StateCrashLoopBackoff:
		c = m.restarts
	case isRecycle(e.To):
		c = m.recycles
	default:
		return
	}
	c.Add(context.Background(), 1, metric.WithAttributes(m.pool, attribute.Int("knit.lane", e.Lane), attribute.String("knit.code", string(code))))
}

// isRecycle reports whether a lane state is its recycling (a lane replaced after serving its
// quota of calls or memory): counted in knit.lane.recycles. It goes by the state's name so
// that the instrument counts recycles whatever state constant names them.
func isRecycle(s State) bool {
	n := s.String()
	return n == "recycling" || n == "recycled"
}

// stopTimedOut counts a lane that did not acknowledge its stop request in time.
func (o *monitor) stopTimedOut(lane int) {
	if o == nil || o.m == nil {
		return
	}
	o.m.stopTimeouts.Add(context.Background(), 1, metric.WithAttributes(o.m.pool, attribute.Int("knit.lane", lane)))
}

// killed counts a signal the host sent a lane process, and why.
func (o *monitor) killed(lane int, signal, reason string) {
	if o == nil || o.m == nil {
		return
	}
	o.m.kills.Add(context.Background(), 1, metric.WithAttributes(o.m.pool, attribute.Int("knit.lane", lane),
		attribute.String("knit.signal", signal), attribute.String("knit.reason", reason)))
}

// killReason names why the host killed a lane process.
func killReason(x lifecycle.Exit) string {
	switch {
	case x.HardTimeout != "":
		return "hard_timeout"
	case x.Unresponsive != "":
		return "unresponsive"
	case x.Corrupt != nil:
		return "corrupt"
	case x.Handoff != nil:
		return "handoff"
	case x.Startup != 0:
		return "startup_timeout"
	}
	return "other"
}

// totalsOf fills ls's counters across incarnations.
func (p *Pool) totalsOf(i int, ls *LaneStats) {
	if p.obs == nil {
		return
	}
	t := p.obs.total(i)
	t.mu.Lock()
	t.fold()
	ls.TotalCompleted = t.completed
	for _, l := range t.live {
		ls.TotalCompleted += l.Counters().Completed
	}
	t.mu.Unlock()
	ls.TotalFailed = t.failed.Load()
	ls.Crashes = int(t.crashes.Load())
}

// taskStats is the latency of every task the pool serves, in the order NewPool got them.
func (p *Pool) taskStats() []TaskStats {
	if p.obs == nil {
		return nil
	}
	now := monoNow()
	var out []TaskStats
	for _, d := range p.defs {
		t := p.obs.tasks[d.Index()]
		if t == nil || t.lat == nil {
			continue
		}
		s := t.lat.Snapshot(now)
		out = append(out, TaskStats{Task: d.Name(), Calls: s.Count, P50: s.Quantile(0.5), P90: s.Quantile(0.9),
			P99: s.Quantile(0.99), Max: s.Max, Window: t.lat.Period()})
	}
	return out
}

// meters are the pool's instruments.
type meters struct {
	pool                                             attribute.KeyValue
	started, finished                                metric.Int64ObservableCounter // counted in taskAttrs, read at collection
	duration, wait, run                              metric.Float64Histogram
	crashes, restarts, recycles, stopTimeouts, kills metric.Int64Counter
	inflight, queued                                 metric.Int64ObservableUpDownCounter
	state                                            metric.Int64ObservableGauge
	reg                                              metric.Registration // the observable instruments' callback, from start
	mu                                               sync.Mutex          // serialises collections: guards laneAttrs, stateAttrs
	laneAttrs                                        []metric.ObserveOption
	stateAttrs                                       [][]metric.ObserveOption // by lane, by state
}

// durationBounds are the call histograms' buckets in seconds: 1 µs to 10 s.
var durationBounds = []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
	1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

func newMeters(p *Pool, o *monitor) (*meters, error) {
	mt := p.cfg.MeterProvider.Meter(meterName)
	m := &meters{pool: attribute.String("knit.pool", p.Name())}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := mt.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := mt.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(durationBounds...))
		errs = append(errs, err)
		return h
	}
	var err error
	// Calls are counted with atomic adds and reported at collection: an SDK counter's Add
	// costs a call several times what the add does.
	m.started, err = mt.Int64ObservableCounter("knit.calls.started", metric.WithUnit("{call}"),
		metric.WithDescription("Calls submitted to the pool, by task."))
	errs = append(errs, err)
	m.finished, err = mt.Int64ObservableCounter("knit.calls.finished", metric.WithUnit("{call}"),
		metric.WithDescription("Calls settled, by task and outcome (OK or the error code)."))
	errs = append(errs, err)
	m.duration = histogram("knit.call.duration", "Time from a call's submission to its settlement, by task and outcome.")
	m.wait = histogram("knit.call.wait.duration", "Time of a call that ran on a lane outside its run: backlog, ring, wake-ups, result return.")
	m.run = histogram("knit.call.run.duration", "Time a call ran on its lane (process lanes: decode, run, encode), by task.")
	m.crashes = counter("knit.lane.crashes", "{crash}", "Lane incarnations that crashed, by lane and code.")
	m.restarts = counter("knit.lane.restarts", "{restart}", "Lane restarts the supervisor scheduled, by lane and the code of the end.")
	m.recycles = counter("knit.lane.recycles", "{recycle}", "Lanes replaced by recycling, by lane.")
	m.stopTimeouts = counter("knit.lane.stop.timeouts", "{lane}", "Lanes that did not acknowledge a stop request within StopAckTimeout.")
	m.kills = counter("knit.lane.kills", "{signal}", "Signals the host sent lane processes to end them, by signal and reason.")
	m.inflight, err = mt.Int64ObservableUpDownCounter("knit.lane.calls.inflight", metric.WithUnit("{call}"),
		metric.WithDescription("Calls a lane holds, running, in its slots or in its backlog."))
	errs = append(errs, err)
	m.queued, err = mt.Int64ObservableUpDownCounter("knit.lane.calls.queued", metric.WithUnit("{call}"),
		metric.WithDescription("Calls in a lane's backlog, beyond its slots."))
	errs = append(errs, err)
	m.state, err = mt.Int64ObservableGauge("knit.lane.state", metric.WithUnit("{state}"),
		metric.WithDescription("1 for a lane's current state, 0 for the others."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, d := range p.defs {
		t := o.tasks[d.Index()]
		t.attr = newTaskAttrs(m.pool, d.Name())
	}
	return m, nil
}

// laneAttrs are lane i's attribute sets: the lane's, and the lane's with each state. They
// are made at collection, the first time lane i is seen. m.mu is held.
func (m *meters) lane(i int, states []State) (attrs metric.ObserveOption, byState []metric.ObserveOption) {
	for len(m.laneAttrs) <= i {
		n := len(m.laneAttrs)
		lane := attribute.Int("knit.lane", n)
		m.laneAttrs = append(m.laneAttrs, metric.WithAttributeSet(attribute.NewSet(m.pool, lane)))
		var bs []metric.ObserveOption
		for _, s := range states {
			bs = append(bs, metric.WithAttributeSet(attribute.NewSet(m.pool, lane, attribute.String("knit.lane.state", s.String()))))
		}
		m.stateAttrs = append(m.stateAttrs, bs)
	}
	return m.laneAttrs[i], m.stateAttrs[i]
}

// laneStates are the states a lane can be in (every State but the pool's Failed).
func laneStates() []State {
	var out []State
	for s := State(0); !strings.HasPrefix(s.String(), "state("); s++ {
		if s != StateFailed {
			out = append(out, s)
		}
	}
	return out
}

// startObserving registers the callback of the observable instruments, once the pool is up.
func (p *Pool) startObserving() error {
	o := p.obs
	if o == nil || o.m == nil {
		return nil
	}
	m := o.m
	states := laneStates()
	reg, err := p.cfg.MeterProvider.Meter(meterName).RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		for _, d := range p.defs {
			t := o.tasks[d.Index()].attr
			ob.ObserveInt64(m.started, int64(t.started.Load()), t.obs...)
			t.observe(ob, m.finished, t.ok)
			for _, a := range *t.codes.Load() {
				t.observe(ob, m.finished, a)
			}
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for i := range p.monLanes() {
			attrs, byState := m.lane(i, states)
			var inflight, queued int64
			if l := p.monLane(i); l != nil && l.State() != lifecycle.LaneEnded {
				inflight, queued = int64(l.inflight.Load()), int64(l.queued())
			}
			ob.ObserveInt64(m.inflight, inflight, attrs)
			ob.ObserveInt64(m.queued, queued, attrs)
			if p.tree == nil {
				continue
			}
			st, _, _ := p.tree.LaneState(i)
			cur := State(st)
			for k, s := range states {
				v := int64(0)
				if s == cur {
					v = 1
				}
				ob.ObserveInt64(m.state, v, byState[k])
			}
		}
		return nil
	}, m.started, m.finished, m.inflight, m.queued, m.state)
	if err != nil {
		return &Error{Code: CodePoolUnavailable, Lane: -1, Message: "registering the pool's metric callback", Cause: err}
	}
	m.reg = reg
	return nil
}

// stopObserving unregisters the callback: a closed pool reports nothing more.
func (p *Pool) stopObserving() {
	if p.obs != nil && p.obs.m != nil && p.obs.m.reg != nil {
		_ = p.obs.m.reg.Unregister()
	}
}

// taskAttrs are a task's attribute sets, built once: recording through them allocates
// nothing.
type taskAttrs struct {
	pool, task attribute.KeyValue
	obs        []metric.ObserveOption // knit.task
	rec        []metric.RecordOption  // knit.task
	started    atomic.Uint64          // calls submitted
	ok         *outcomeAttrs
	mu         sync.Mutex // serialises additions to codes
	codes      atomic.Pointer[map[Code]*outcomeAttrs]
}

// outcomeAttrs are the attribute sets of one task and outcome, and its count of calls.
type outcomeAttrs struct {
	n   atomic.Uint64
	obs []metric.ObserveOption
	rec []metric.RecordOption
}

// observe reports an outcome's count, once it has counted a call (a series appears with its
// first call, and a count never goes back to 0).
func (t *taskAttrs) observe(ob metric.Observer, c metric.Int64ObservableCounter, a *outcomeAttrs) {
	if n := a.n.Load(); n != 0 {
		ob.ObserveInt64(c, int64(n), a.obs...)
	}
}

// knownCodes have their attribute sets built with the pool. Other codes (a task's own, in
// an *Error it returned) get theirs when first seen, up to maxCodes per task; beyond that
// they count as "OTHER", so that no task can grow the instruments' cardinality without
// bound.
var knownCodes = [...]Code{CodePoolClosed, CodeTimeout, CodeTaskPanic, CodeTaskError, CodePayloadTooLarge,
	CodeOverloaded, CodeUnsupportedType, CodePoolUnavailable, CodeInvalidArgument, CodeUnknownTask, CodeCanceled, CodeThreadClosed,
	CodeWorkerCrashed, CodeWorkerExited, CodeStartupFailed, CodeUnresponsive, CodePoisonCall, CodeOutOfMemory, CodeCPULimit, CodeNodeLost}

const maxCodes = 64

const (
	outcomeOK    = "OK"
	outcomeOther = "OTHER"
)

func newTaskAttrs(pool attribute.KeyValue, task string) *taskAttrs {
	t := &taskAttrs{pool: pool, task: attribute.String("knit.task", task)}
	set := attribute.NewSet(pool, t.task)
	t.obs = []metric.ObserveOption{metric.WithAttributeSet(set)}
	t.rec = []metric.RecordOption{metric.WithAttributeSet(set)}
	t.ok = t.build(outcomeOK)
	codes := make(map[Code]*outcomeAttrs, len(knownCodes)+1)
	for _, c := range knownCodes {
		codes[c] = t.build(string(c))
	}
	codes[outcomeOther] = t.build(outcomeOther)
	t.codes.Store(&codes)
	return t
}

func (t *taskAttrs) build(outcome string) *outcomeAttrs {
	set := attribute.NewSet(t.pool, t.task, attribute.String("knit.outcome", outcome))
	return &outcomeAttrs{obs: []metric.ObserveOption{metric.WithAttributeSet(set)}, rec: []metric.RecordOption{metric.WithAttributeSet(set)}}
}

// outcome is the attribute set of a call that settled with err.
func (t *taskAttrs) outcome(err error) *outcomeAttrs {
	if err == nil {
		return t.ok
	}
	code := Code(outcomeOther)
	if ke, ok := err.(*Error); ok {
		code = ke.Code
	} else if ke := coded(nil); errors.As(err, &ke) {
		code = Code(ke.KnitCode())
	}
	if a := (*t.codes.Load())[code]; a != nil {
		return a
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	codes := *t.codes.Load()
	if a := codes[code]; a != nil {
		return a
	}
	if len(codes) >= maxCodes {
		return codes[outcomeOther]
	}
	next := make(map[Code]*outcomeAttrs, len(codes)+1)
	for c, a := range codes {
		next[c] = a
	}
	a := t.build(string(code))
	next[code] = a
	t.codes.Store(&next)
	return a
}
