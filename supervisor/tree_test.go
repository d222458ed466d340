package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/goleak"

	"github.com/knitgo/knit/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeWorker is a lane the test ends at will.
type fakeWorker struct {
	lane, inc  int
	ignoreStop bool
	once       sync.Once
	ended      chan struct{}
	end        End
}

func (w *fakeWorker) Ended() <-chan struct{}      { return w.ended }
func (w *fakeWorker) End() End                    { return w.end }
func (w *fakeWorker) Open()                       {}
func (w *fakeWorker) finish(e End)                { w.once.Do(func() { w.end = e; close(w.ended) }) }
func (w *fakeWorker) Retire(<-chan struct{}) bool { return w.Stop() }
func (w *fakeWorker) Stop() bool {
	msg := "lane stopped (exit status 0)"
	if w.ignoreStop {
		msg = "lane stopped (killed by signal SIGKILL)"
	}
	w.finish(End{Err: &lifecycle.Error{Code: lifecycle.CodeThreadClosed, Lane: w.lane, Message: msg}})
	return !w.ignoreStop
}

type fakeHost struct {
	mu        sync.Mutex
	workers   map[int][]*fakeWorker
	startErr  func(lane, inc int) error
	hold      func(lane, inc int) // called before a start, without mu: may block
	ignore    map[int]bool
	cond      *sync.Cond
	all       []Event
	failedErr error
}

func newFakeHost() *fakeHost {
	h := &fakeHost{workers: map[int][]*fakeWorker{}, ignore: map[int]bool{}}
	h.cond = sync.NewCond(&h.mu)
	return h
}

func (h *fakeHost) StartLane(lane, inc int) (Worker, error) {
	if h.hold != nil {
		h.hold(lane, inc)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.startErr != nil {
		if err := h.startErr(lane, inc); err != nil {
			return nil, err
		}
	}
	w := &fakeWorker{lane: lane, inc: inc, ended: make(chan struct{}), ignoreStop: h.ignore[lane]}
	h.workers[lane] = append(h.workers[lane], w)
	return w, nil
}

func (h *fakeHost) Event(e Event) {
	h.mu.Lock()
	h.all = append(h.all, e)
	h.cond.Broadcast()
	h.mu.Unlock()
}

func (h *fakeHost) Failed(err error) {
	h.mu.Lock()
	h.failedErr = err
	h.mu.Unlock()
}

func (h *fakeHost) worker(lane int) *fakeWorker {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.workers[lane]
	return ws[len(ws)-1]
}

// await waits for lane's incarnation inc to reach state to (the supervisor reports every
// transition, so this is an event, not a poll) and returns the event.
func (h *fakeHost) await(t *testing.T, lane, inc int, to State) Event {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		for _, e := range h.all {
			if e.Lane == lane && e.To == to && (inc < 0 || e.Incarnation == inc) {
				return e
			}
		}
		h.cond.Wait()
	}
}

// transitions lists the states lane went through, in order.
func (h *fakeHost) transitions(lane int) []State {
	h.mu.Lock()
	defer h.mu.Unlock()
	var s []State
	for _, e := range h.all {
		if e.Lane == lane {
			s = append(s, e.To)
		}
	}
	return s
}

// checkChain checks that lane's events form one chain, each starting where the last ended:
// one writer, in order.
func (h *fakeHost) checkChain(t *testing.T, lane int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	at := New
	for _, e := range h.all {
		if e.Lane != lane {
			continue
		}
		if e.From != at {
			t.Errorf("lane %d: event %v→%v after %v", lane, e.From, e.To, at)
		}
		at = e.To
	}
}

func crash() End {
	return End{Err: &lifecycle.Error{Code: lifecycle.CodeWorkerCrashed, Message: "killed by signal SIGKILL"}}
}

func exit(status int) End {
	return End{Err: &lifecycle.Error{Code: lifecycle.CodeWorkerExited, Message: fmt.Sprintf("exit status %d", status)}, Normal: status == 0}
}

func start(t *testing.T, lanes int, pol Policy, h *fakeHost) *Tree {
	t.Helper()
	tr, err := Start(Config{Lanes: lanes, Policy: pol, Rand: func() float64 { return 0.5 }, Logger: quiet}, h)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

var quiet = actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
	return slog.New(slog.DiscardHandler)
})

var fast = Backoff{Min: -1, Jitter: -1}

func TestStrategies(t *testing.T) {
	for _, tc := range []struct {
		s         Strategy
		restarted []bool // per lane of 4, after lane 1 crashes
	}{
		{OneForOne, []bool{false, true, false, false}},
		{AllForOne, []bool{true, true, true, true}},
		{RestForOne, []bool{false, true, true, true}},
	} {
		t.Run(tc.s.String(), func(t *testing.T) {
			h := newFakeHost()
			tr := start(t, 4, Policy{Strategy: tc.s, Backoff: fast}, h)
			h.worker(1).finish(crash())
			for i, want := range tc.restarted {
				if !want {
					continue
				}
				h.await(t, i, 1, Ready)
			}
			for i, want := range tc.restarted {
				h.checkChain(t, i)
				got := h.transitions(i)
				if !want {
					if len(got) != 2 {
						t.Errorf("lane %d should be untouched, went %v", i, got)
					}
					continue
				}
				wantSeq := []State{Booting, Ready, Crashed, Restarting, Booting, Ready}
				if i != 1 {
					wantSeq = []State{Booting, Ready, Stopping, Closed, Restarting, Booting, Ready}
				}
				if fmt.Sprint(got) != fmt.Sprint(wantSeq) {
					t.Errorf("lane %d went %v, want %v", i, got, wantSeq)
				}
			}
			if un := tr.Close(); len(un) != 0 {
				t.Errorf("unacked %v", un)
			}
		})
	}
}

func TestRestartTypes(t *testing.T) {
	ends := map[string]End{"exit 0": exit(0), "exit 3": exit(3), "crash": crash(),
		"startup": {Err: &lifecycle.Error{Code: lifecycle.CodeStartupFailed}}}
	want := map[RestartType]map[string]bool{
		Permanent: {"exit 0": true, "exit 3": true, "crash": true, "startup": true},
		Transient: {"exit 0": false, "exit 3": true, "crash": true, "startup": true},
		Temporary: {"exit 0": false, "exit 3": false, "crash": false, "startup": false},
	}
	for typ, cases := range want {
		for name, restart := range cases {
			if got := ShouldRestart(typ, ends[name]); got != restart {
				t.Errorf("%v after %s: restart %v, want %v", typ, name, got, restart)
			}
		}
		if ShouldRestart(typ, End{Err: &lifecycle.Error{Code: lifecycle.CodeThreadClosed}}) {
			t.Errorf("%v restarts a lane the host stopped", typ)
		}
	}
	// And through the tree: a transient lane that exits 0 is not restarted.
	h := newFakeHost()
	tr := start(t, 2, Policy{Backoff: fast}, h)
	h.worker(0).finish(exit(0))
	e := h.await(t, 0, -1, Dead)
	if e.Reason == "" {
		t.Error("dead without a reason")
	}
	h.worker(1).finish(exit(3))
	h.await(t, 1, 1, Ready)
	tr.Close()
}

// The OTP behaviour, chosen explicitly: past its intensity a lane is given up, and with no
// lane left the pool fails and its parent is told.
func TestGiveUpIntensityAndBackoffSchedule(t *testing.T) {
	h := newFakeHost()
	sys := actor.NewActorSystem(quiet, actor.WithDeadLetterThrottleInterval(deadLetterInterval))
	defer sys.Shutdown()
	told := make(chan *PoolFailed, 1)
	parent := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*PoolFailed); ok {
			told <- m
		}
	}))
	pol := Policy{MaxRestarts: 5, Period: time.Hour, OnIntensity: GiveUp,
		Backoff: Backoff{Min: time.Millisecond, Max: 4 * time.Millisecond, Jitter: -1, Reset: time.Hour}}
	tr, err := Start(Config{Lanes: 1, Policy: pol, System: sys, Parent: parent, Name: "pool"}, h)
	if err != nil {
		t.Fatal(err)
	}
	for inc := 0; inc <= 5; inc++ {
		h.await(t, 0, inc, Ready)
		h.worker(0).finish(crash())
	}
	if e := h.await(t, 0, 5, Dead); e.Reason == "" {
		t.Error("given up without a reason")
	}
	var delays []time.Duration
	h.mu.Lock()
	for _, e := range h.all {
		if e.To == Restarting {
			delays = append(delays, e.Delay)
		}
	}
	h.mu.Unlock()
	want := []time.Duration{1, 2, 4, 4, 4}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if fmt.Sprint(delays) != fmt.Sprint(want) {
		t.Errorf("backoff schedule %v, want %v", delays, want)
	}
	h.await(t, -1, 0, Failed)
	h.checkChain(t, 0)
	h.mu.Lock()
	if last := h.all[len(h.all)-1]; last.Lane != -1 || last.To != Failed {
		t.Errorf("last event %+v, want the pool failed after its lane was dead", last)
	}
	h.mu.Unlock()
	m := <-told
	if !errors.Is(m.Err, lifecycle.ErrPoolUnavailable) || !m.Pool.Equal(tr.PID()) {
		t.Errorf("parent told %v", m)
	}
	h.mu.Lock()
	if h.failedErr == nil {
		t.Error("host not told")
	}
	h.mu.Unlock()
	tr.Close()
	_ = sys.Root.StopFuture(parent).Wait()
}

func TestBackoffDelay(t *testing.T) {
	b := Policy{Backoff: Backoff{Min: 10 * time.Millisecond, Max: time.Second, Jitter: 0.5}}.WithDefaults().Backoff
	prev := time.Duration(0)
	for n := 1; n < 20; n++ {
		lo, hi := b.Delay(n, 0), b.Delay(n, 0.999999)
		if lo < prev || lo > b.Max || hi > b.Max+b.Max/2 || hi < lo {
			t.Fatalf("n=%d: delay in [%v,%v] after %v", n, lo, hi, prev)
		}
		prev = lo
	}
	if b.Delay(1, 0) != 10*time.Millisecond || b.Delay(30, 0) != time.Second {
		t.Errorf("first %v, capped %v", b.Delay(1, 0), b.Delay(30, 0))
	}
}

func TestBackoffResetsAfterQuietPeriod(t *testing.T) {
	h := newFakeHost()
	// Reset of one nanosecond: every incarnation that became ready counts as quiet.
	pol := Policy{Backoff: Backoff{Min: time.Millisecond, Max: time.Second, Jitter: -1, Reset: 1}}
	tr := start(t, 1, pol, h)
	for inc := range 3 {
		h.await(t, 0, inc, Ready)
		h.worker(0).finish(crash())
		if e := h.await(t, 0, inc, Restarting); e.Delay != time.Millisecond {
			t.Errorf("delay %v after a quiet period", e.Delay)
		}
	}
	tr.Close()
}

func TestCloseStopsInReverseOrderAndNamesUnacked(t *testing.T) {
	h := newFakeHost()
	h.ignore[1] = true
	tr := start(t, 3, Policy{}, h)
	for i := range 3 {
		h.await(t, i, 0, Ready)
	}
	if un := tr.Close(); fmt.Sprint(un) != "[1]" {
		t.Errorf("unacked %v", un)
	}
	var order []int
	h.mu.Lock()
	for _, e := range h.all {
		if e.To == Stopping {
			order = append(order, e.Lane)
		}
		if e.To == Closed && e.Code != lifecycle.CodeThreadClosed {
			t.Errorf("closed with %v", e.Code)
		}
	}
	h.mu.Unlock()
	if fmt.Sprint(order) != "[2 1 0]" {
		t.Errorf("stop order %v", order)
	}
}

func TestStartupFailureClosesTree(t *testing.T) {
	h := newFakeHost()
	h.startErr = func(lane, inc int) error {
		if lane == 1 {
			return &lifecycle.Error{Code: lifecycle.CodeStartupFailed, Lane: 1, Message: "boom"}
		}
		return nil
	}
	_, err := Start(Config{Lanes: 3, Logger: quiet}, h)
	if !errors.Is(err, lifecycle.ErrStartupFailed) {
		t.Fatalf("err %v", err)
	}
	for _, l := range []int{0, 2} {
		if s := h.transitions(l); s[len(s)-1] != Closed {
			t.Errorf("lane %d left in %v", l, s)
		}
	}
}

// A lane that restarts while another is still on its first boot does not count as that
// boot: Start reports the other lane's failure.
func TestStartWaitsForEveryFirstBoot(t *testing.T) {
	h := newFakeHost()
	release := make(chan struct{})
	h.hold = func(lane, inc int) {
		if lane == 1 && inc == 0 {
			<-release
		}
	}
	h.startErr = func(lane, inc int) error {
		if lane == 1 {
			return &lifecycle.Error{Code: lifecycle.CodeStartupFailed, Lane: 1, Message: "boom"}
		}
		return nil
	}
	started := make(chan error, 1)
	go func() {
		_, err := Start(Config{Lanes: 2, Policy: Policy{Backoff: fast}, Logger: quiet}, h)
		started <- err
	}()
	h.await(t, 0, 0, Ready)
	h.worker(0).finish(crash())
	h.await(t, 0, 1, Ready) // lane 0 restarted while lane 1 still boots
	close(release)
	if err := <-started; !errors.Is(err, lifecycle.ErrStartupFailed) {
		t.Fatalf("Start: %v, want lane 1's startup failure", err)
	}
}

func TestGiveUpRestartStartupFailureCountsTowardIntensity(t *testing.T) {
	h := newFakeHost()
	pol := Policy{MaxRestarts: 2, Period: time.Hour, OnIntensity: GiveUp, Backoff: fast}
	tr := start(t, 2, pol, h)
	h.mu.Lock()
	h.startErr = func(lane, inc int) error {
		if lane == 0 && inc > 0 {
			return errors.New("no luck")
		}
		return nil
	}
	h.mu.Unlock()
	h.worker(0).finish(crash())
	h.await(t, 0, -1, Dead)
	if got := h.transitions(0); fmt.Sprint(got) != fmt.Sprint([]State{Booting, Ready, Crashed, Restarting, Booting, StartupFailed, Restarting, Booting, StartupFailed, Dead}) {
		t.Errorf("lane 0 went %v", got)
	}
	if s, _, _ := tr.LaneState(1); s != Ready {
		t.Errorf("lane 1 %v", s)
	}
	tr.Close()
}

// fakeClock is a clock the test moves: its timers fire when the test fires them, moving the
// clock by their delay, so a minute of crash-loop backoff takes no time.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers chan *fakeTimer // each AfterFunc, as it is called
}

type fakeTimer struct {
	d       time.Duration
	f       func()
	stopped atomic.Bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), timers: make(chan *fakeTimer, 64)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	tm := &fakeTimer{d: d, f: f}
	c.timers <- tm
	return tm
}

func (tm *fakeTimer) Stop() bool { return !tm.stopped.Swap(true) }

// fire waits for the next timer the tree starts, checks its delay, moves the clock past it
// and runs it.
func (c *fakeClock) fire(t *testing.T, want time.Duration) {
	t.Helper()
	tm := <-c.timers
	if tm.d != want {
		t.Errorf("timer of %v, want %v (the event's delay)", tm.d, want)
	}
	c.advance(tm.d)
	if !tm.stopped.Swap(true) {
		tm.f()
	}
}

// awaitDecision waits for the restart decision on lane's incarnation inc.
func (h *fakeHost) awaitDecision(t *testing.T, lane, inc int) Event {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		for _, e := range h.all {
			if e.Lane == lane && e.Incarnation == inc && (e.To == Restarting || e.To == CrashLoopBackoff || e.To == Dead) {
				return e
			}
		}
		h.cond.Wait()
	}
}

func startClock(t *testing.T, lanes int, pol Policy, h *fakeHost, clk *fakeClock) *Tree {
	t.Helper()
	tr, err := Start(Config{Lanes: lanes, Policy: pol, Rand: func() float64 { return 0 }, Clock: clk, Logger: quiet}, h)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// The default policy: a lane that fails forever, at once, is never given up. Past 5 restarts
// within 10 s it is in crash-loop backoff, its delays doubling up to a minute; the other lane
// serves on, the pool never fails, and once an incarnation has served for 10 s the lane
// starts over.
func TestCrashLoopByDefault(t *testing.T) {
	h, clk := newFakeHost(), newFakeClock()
	tr := startClock(t, 2, Policy{}, h, clk)
	var got []string
	inc := 0
	for ; inc < 22; inc++ {
		h.await(t, 0, inc, Ready)
		h.worker(0).finish(crash())
		e := h.awaitDecision(t, 0, inc)
		got = append(got, fmt.Sprintf("%v %v", e.To, e.Delay))
		if e.To == Dead {
			t.Fatalf("lane given up: %s", e.Reason)
		}
		if e.To == CrashLoopBackoff && !strings.Contains(e.Reason, "crash loop") {
			t.Errorf("crash-loop reason %q", e.Reason)
		}
		if s, _, _ := tr.LaneState(0); s != e.To {
			t.Errorf("lane state %v while it waits, want %v", s, e.To)
		}
		if tr.AllBackingOff() {
			t.Error("all backing off while lane 1 serves")
		}
		clk.fire(t, e.Delay)
	}
	var want []string
	d := time.Millisecond
	for n := 1; n <= inc; n++ {
		to := Restarting
		if n > DefaultMaxRestarts {
			to = CrashLoopBackoff
		}
		want = append(want, fmt.Sprintf("%v %v", to, d))
		d = min(2*d, DefaultCrashLoopMax)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("decisions\n%v\nwant\n%v", got, want)
	}
	// A quiet incarnation: the lane leaves crash-loop backoff.
	h.await(t, 0, inc, Ready)
	clk.advance(DefaultPeriod)
	h.worker(0).finish(crash())
	if e := h.awaitDecision(t, 0, inc); e.To != Restarting || e.Delay != time.Millisecond {
		t.Errorf("after a quiet period: %v after %v, want restarting after 1ms", e.To, e.Delay)
	}
	clk.fire(t, time.Millisecond)
	h.await(t, 0, inc+1, Ready)
	h.checkChain(t, 0)
	if s := h.transitions(1); len(s) != 2 {
		t.Errorf("lane 1 went %v", s)
	}
	h.mu.Lock()
	if h.failedErr != nil {
		t.Errorf("pool failed: %v", h.failedErr)
	}
	h.mu.Unlock()
	if _, _, restarts := tr.LaneState(0); restarts != inc+1 {
		t.Errorf("%d restarts, want %d", restarts, inc+1)
	}
	tr.Close()
}

// With every lane in crash-loop backoff, AllBackingOff says so, until one boots again; under
// AllForOne the lanes stopped with a crash-looping lane wait in crash-loop backoff too.
func TestAllBackingOff(t *testing.T) {
	h, clk := newFakeHost(), newFakeClock()
	tr := startClock(t, 2, Policy{Strategy: AllForOne, MaxRestarts: 1}, h, clk)
	for inc := range 2 {
		h.await(t, 0, inc, Ready)
		h.await(t, 1, inc, Ready)
		h.worker(0).finish(crash())
		e := h.awaitDecision(t, 0, inc)
		sib := h.awaitDecision(t, 1, inc)
		if sib.To != e.To || sib.Delay != e.Delay {
			t.Errorf("lane 1 %v after %v, with lane 0 %v after %v", sib.To, sib.Delay, e.To, e.Delay)
		}
		if inc == 0 {
			if e.To != Restarting || tr.AllBackingOff() {
				t.Errorf("first restart %v, all backing off %v", e.To, tr.AllBackingOff())
			}
		} else {
			if e.To != CrashLoopBackoff || sib.Reason != "crash-loop backoff with lane 0" {
				t.Errorf("second restart %v, lane 1 %q", e.To, sib.Reason)
			}
			if !tr.AllBackingOff() {
				t.Error("every lane in crash-loop backoff, AllBackingOff false")
			}
		}
		clk.fire(t, e.Delay)
	}
	h.await(t, 1, 2, Ready)
	if tr.AllBackingOff() {
		t.Error("AllBackingOff with lanes ready")
	}
	tr.Close()
}

// A lane whose restarts fail to boot under the default policy is not given up either.
func TestCrashLoopStartupFailures(t *testing.T) {
	h, clk := newFakeHost(), newFakeClock()
	tr := startClock(t, 1, Policy{MaxRestarts: 2}, h, clk)
	h.mu.Lock()
	h.startErr = func(lane, inc int) error {
		if inc > 0 && inc < 6 {
			return errors.New("no luck")
		}
		return nil
	}
	h.mu.Unlock()
	h.worker(0).finish(crash())
	for inc := range 6 {
		e := h.awaitDecision(t, 0, inc)
		if want := map[bool]State{true: Restarting, false: CrashLoopBackoff}[inc < 2]; e.To != want {
			t.Errorf("incarnation %d: %v, want %v", inc, e.To, want)
		}
		clk.fire(t, e.Delay)
	}
	h.await(t, 0, 6, Ready)
	tr.Close()
}

// Resize: added lanes boot supervised and restart with RestForOne along with the lanes
// below them; removed lanes retire, close and leave the tree, and later failures restart
// only the lanes that are left. A lane added again at a removed index goes on with its
// incarnation numbers.
func TestResizeStrategies(t *testing.T) {
	h := newFakeHost()
	tr := start(t, 2, Policy{Strategy: RestForOne, Backoff: fast}, h)
	if err := tr.Resize(4, nil); err != nil {
		t.Fatal(err)
	}
	h.await(t, 3, 0, Ready)
	h.await(t, 2, 0, Ready)
	if e := h.await(t, 3, 0, Booting); e.Reason != "added: pool resized to 4 lanes" {
		t.Errorf("added lane's boot: %+v", e)
	}
	h.worker(1).finish(crash())
	for i := 1; i < 4; i++ {
		h.await(t, i, 1, Ready)
	}
	if got := h.transitions(0); len(got) != 2 {
		t.Errorf("lane 0 went %v: RestForOne must leave it alone", got)
	}
	for _, i := range []int{2, 3} {
		want := []State{Booting, Ready, Stopping, Closed, Restarting, Booting, Ready}
		if got := h.transitions(i); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("added lane %d went %v, want %v", i, got, want)
		}
	}
	if err := tr.Resize(2, nil); err != nil {
		t.Fatal(err)
	}
	if n := tr.Lanes(); n != 2 {
		t.Fatalf("%d lanes after shrinking to 2", n)
	}
	for _, i := range []int{2, 3} {
		h.checkChain(t, i)
		got := h.transitions(i)
		if want := []State{Retiring, Closed, Removed}; fmt.Sprint(got[len(got)-3:]) != fmt.Sprint(want) {
			t.Errorf("removed lane %d went %v, want it to end %v", i, got, want)
		}
		if s, _, _ := tr.LaneState(i); s != New {
			t.Errorf("LaneState(%d) = %v after removal", i, s)
		}
	}
	// AllForOne now would take lane 1 only; RestForOne from lane 0 takes lane 1.
	h.worker(0).finish(crash())
	h.await(t, 0, 1, Ready)
	h.await(t, 1, 2, Ready)
	for _, i := range []int{2, 3} {
		if got := h.transitions(i); got[len(got)-1] != Removed {
			t.Errorf("removed lane %d was touched by a restart: %v", i, got)
		}
	}
	// Lane 2 again: its first incarnation follows the removed lane's last.
	if err := tr.Resize(3, nil); err != nil {
		t.Fatal(err)
	}
	h.await(t, 2, 2, Ready)
	if un := tr.Close(); len(un) != 0 {
		t.Errorf("unacked %v", un)
	}
	if err := tr.Resize(1, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Resize after Close: %v", err)
	}
}

// Recycle: the next incarnation boots while the current one serves, is ready before the
// recycled one stops, and no restart is counted. A replacement that fails to boot leaves the
// current incarnation serving.
func TestRecycle(t *testing.T) {
	h := newFakeHost()
	var fail atomic.Bool
	h.startErr = func(lane, inc int) error {
		if fail.Load() && inc > 0 {
			return &lifecycle.Error{Code: lifecycle.CodeStartupFailed, Lane: lane, Message: "no"}
		}
		return nil
	}
	tr := start(t, 2, Policy{Backoff: fast}, h)
	tr.Recycle(1, 0, "MaxCallsPerLane: test")
	h.await(t, 1, 0, Closed)
	var got []string
	h.mu.Lock()
	for _, e := range h.all {
		if e.Lane == 1 {
			got = append(got, fmt.Sprintf("%d:%v>%v", e.Incarnation, e.From, e.To))
		}
	}
	h.mu.Unlock()
	want := "[0:new>booting 0:booting>ready 0:ready>recycling 1:recycling>booting 1:recycling>ready 0:recycling>stopping 0:stopping>closed]"
	if fmt.Sprint(got) != want {
		t.Errorf("recycle went %v, want %v", got, want)
	}
	if s, inc, restarts := tr.LaneState(1); s != Ready || inc != 1 || restarts != 0 || tr.Recycles(1) != 1 {
		t.Errorf("lane 1 after its recycle: %v, incarnation %d, %d restarts, %d recycles", s, inc, restarts, tr.Recycles(1))
	}
	tr.Recycle(1, 0, "stale") // not the current incarnation: dropped
	fail.Store(true)
	tr.Recycle(0, 0, "MaxLaneMemory: test")
	if e := h.await(t, 0, -1, StartupFailed); e.Incarnation != 1 {
		t.Errorf("lane 0's replacement: %+v", e)
	}
	h.mu.Lock()
	for last := h.all[len(h.all)-1]; last.Lane != 0 || last.To != Ready; last = h.all[len(h.all)-1] {
		h.cond.Wait()
	}
	h.mu.Unlock()
	if s, inc, _ := tr.LaneState(0); s != Ready || inc != 0 {
		t.Errorf("lane 0 after a failed recycle: %v, incarnation %d; want ready, 0", s, inc)
	}
	if un := tr.Close(); len(un) != 0 {
		t.Errorf("unacked %v", un)
	}
	if n := len(h.workers[1]); n != 2 {
		t.Errorf("lane 1 had %d workers, want 2 (the stale recycle must not start one)", n)
	}
}

// A lane waiting out its restart backoff is removed at once: nothing runs there, and it never
// boots again.
func TestResizeRemovesLaneInBackoff(t *testing.T) {
	h := newFakeHost()
	tr := start(t, 3, Policy{Backoff: Backoff{Min: time.Hour, Max: time.Hour, Jitter: -1}}, h)
	h.worker(2).finish(crash())
	h.await(t, 2, 0, Restarting)
	if err := tr.Resize(2, nil); err != nil {
		t.Fatal(err)
	}
	got := h.transitions(2)
	if want := []State{Booting, Ready, Crashed, Restarting, Removed}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("lane 2 went %v, want %v", got, want)
	}
	if un := tr.Close(); len(un) != 0 {
		t.Errorf("unacked %v", un)
	}
	if n := len(h.workers[2]); n != 1 {
		t.Errorf("lane 2 had %d workers: it booted again after its removal", n)
	}
}
