package supervisor

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/knitgo/knit/lifecycle"
)

// step is one failure of lane 0 in a decision table: it happens at time at (from the table's
// epoch), after an incarnation that became ready at up (negative: it never did), and the
// decision is to be want (To, Delay, and Reason containing reason).
type step struct {
	at, up time.Duration
	end    End
	want   State
	delay  time.Duration
	reason string
}

func fail(at, up time.Duration, want State, delay time.Duration, reason string) step {
	return step{at: at, up: up, end: crash(), want: want, delay: delay, reason: reason}
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// run feeds the steps to Decide one after the other, threading the history through, and
// checks each decision.
func run(t *testing.T, pol Policy, steps []step) History {
	t.Helper()
	pol = pol.WithDefaults()
	var h History
	for i, s := range steps {
		f := Failure{Lane: 0, End: s.end}
		if s.up >= 0 {
			f.Up = epoch.Add(s.up)
		}
		before := History{Failures: slices.Clone(h.Failures), Streak: h.Streak, Looping: h.Looping}
		d, next := Decide(pol, h, f, epoch.Add(s.at), []bool{true}, 0)
		if fmt.Sprint(h) != fmt.Sprint(before) {
			t.Fatalf("step %d: Decide changed its input history: %v, was %v", i, h, before)
		}
		if d.To != s.want || d.Delay != s.delay || !strings.Contains(d.Reason, s.reason) {
			t.Fatalf("step %d (failure at %v): %v after %v (%q), want %v after %v (%q)",
				i, s.at, d.To, d.Delay, d.Reason, s.want, s.delay, s.reason)
		}
		if d.To == Dead && d.Group != nil || d.To != Dead && fmt.Sprint(d.Group) != "[0]" {
			t.Fatalf("step %d: group %v with %v", i, d.Group, d.To)
		}
		h = next
	}
	return h
}

const (
	ms  = time.Millisecond
	sec = time.Second
)

// A lane that fails at once, every time: 0 ms apart on the clock, up 0.
func fastFailures(n int) []time.Duration {
	at := make([]time.Duration, n)
	for i := range at {
		at[i] = time.Duration(i) * ms
	}
	return at
}

func TestDecideTable(t *testing.T) {
	noJitter := Backoff{Jitter: -1}
	for _, tc := range []struct {
		name  string
		pol   Policy
		steps []step
	}{
		{"transient exit 0 is not restarted", Policy{}, []step{
			{at: 0, up: 0, end: exit(0), want: Dead, reason: "not restarted (transient lane)"},
		}},
		{"temporary crash is not restarted", Policy{Type: Temporary}, []step{
			{at: 0, up: 0, end: crash(), want: Dead, reason: "temporary"},
		}},
		{"permanent exit 0 restarts", Policy{Type: Permanent, Backoff: noJitter}, []step{
			{at: 0, up: 0, end: exit(0), want: Restarting, delay: ms, reason: "restart 1 within 10s"},
		}},
		{"restart that never booted counts", Policy{Backoff: noJitter}, []step{
			fail(0, 0, Restarting, 1*ms, "restart 1"),
			{at: ms, up: -1, end: End{Err: &lifecycle.Error{Code: lifecycle.CodeStartupFailed}}, want: Restarting, delay: 2 * ms, reason: "restart 2"},
		}},
		{"backoff doubles up to Max", Policy{MaxRestarts: -1, Backoff: Backoff{Min: 10 * ms, Max: 50 * ms, Jitter: -1}}, []step{
			fail(0, 0, Restarting, 10*ms, ""),
			fail(1, 1, Restarting, 20*ms, ""),
			fail(2, 2, Restarting, 40*ms, ""),
			fail(3, 3, Restarting, 50*ms, ""),
			fail(4, 4, Restarting, 50*ms, "restart 5 within 10s"),
		}},
		{"no delay stays none", Policy{MaxRestarts: 1, Backoff: Backoff{Min: -1, Jitter: -1}}, []step{
			fail(0, 0, Restarting, 0, ""),
			fail(1, 1, CrashLoopBackoff, 0, "crash loop"),
		}},
		{"give up past the intensity", Policy{OnIntensity: GiveUp, MaxRestarts: 2, Period: sec, Backoff: noJitter}, []step{
			fail(0, 0, Restarting, 1*ms, "restart 1 within 1s"),
			fail(100*ms, 99*ms, Restarting, 2*ms, "restart 2 within 1s"),
			fail(200*ms, 199*ms, Dead, 0, "restart intensity reached: 2 restarts within 1s"),
		}},
		{"old failures leave the window", Policy{OnIntensity: GiveUp, MaxRestarts: 2, Period: sec, Backoff: noJitter}, []step{
			fail(0, 0, Restarting, 1*ms, "restart 1"),
			fail(600*ms, 599*ms, Restarting, 2*ms, "restart 2"),
			fail(1100*ms, 1099*ms, Restarting, 4*ms, "restart 2"), // the first has left
			fail(1500*ms, 1499*ms, Dead, 0, "intensity"),
		}},
		{"a quiet incarnation resets the streak", Policy{MaxRestarts: -1, Backoff: Backoff{Min: 10 * ms, Jitter: -1, Reset: sec}}, []step{
			fail(0, 0, Restarting, 10*ms, ""),
			fail(10*ms, 5*ms, Restarting, 20*ms, ""),
			fail(3*sec, 2*sec, Restarting, 10*ms, ""), // served 1s: fresh
			fail(3010*ms, 3005*ms, Restarting, 20*ms, ""),
		}},
		{"no limit never loops", Policy{MaxRestarts: -1, Backoff: noJitter}, []step{
			fail(0, 0, Restarting, 1*ms, ""), fail(1, 1, Restarting, 2*ms, ""), fail(2, 2, Restarting, 4*ms, ""),
			fail(3, 3, Restarting, 8*ms, ""), fail(4, 4, Restarting, 16*ms, ""), fail(5, 5, Restarting, 32*ms, ""),
			fail(6, 6, Restarting, 64*ms, ""),
		}},
		// Issue 30: deaths a call caused are the call's (rule 1a), deaths at boot are the lane's.
		{"deaths while running a call restart at once, uncounted", Policy{Backoff: noJitter}, callDeaths(10, false)},
		{"CountCallDeaths counts them", Policy{Backoff: noJitter, CountCallDeaths: true}, callDeaths(8, true)},
		{"a lane failing at boot 10 times backs off", Policy{Backoff: noJitter}, bootFailures(10)},
		{"a call death of an incarnation that never became ready counts", Policy{Backoff: noJitter}, []step{
			{at: 0, up: -1, end: End{Err: &lifecycle.Error{Code: lifecycle.CodeWorkerCrashed}, Running: true}, want: Restarting, delay: ms, reason: "restart 1 within 10s"},
		}},
		// The default: past 5 restarts in 10s the lane is in crash-loop backoff, its delay
		// doubling past Max (2s) up to CrashLoopMax (1min).
		{"crash loop by default", Policy{Backoff: noJitter}, crashLoopSteps()},
		{"crash loop is sticky until a quiet incarnation", Policy{MaxRestarts: 1, Period: 2 * sec, Backoff: Backoff{Min: sec, Max: 2 * sec, CrashLoopMax: 8 * sec, Jitter: -1, Reset: 5 * sec}}, []step{
			fail(0, 0, Restarting, 1*sec, "restart 1 within 2s"),
			fail(1*sec, 1*sec, CrashLoopBackoff, 2*sec, "crash loop: restart 2 in a row, past 1 restarts within 2s; waiting 2s"),
			// 3s later the window holds one failure, yet the lane stays in crash-loop backoff
			fail(4*sec, 3*sec, CrashLoopBackoff, 4*sec, "restart 3 in a row"),
			fail(9*sec, 8*sec, CrashLoopBackoff, 8*sec, ""),
			fail(18*sec, 17*sec, CrashLoopBackoff, 8*sec, "restart 5 in a row"),
			// served 5s: it leaves crash-loop backoff and starts over
			fail(40*sec, 35*sec, Restarting, 1*sec, "restart 1 within 2s"),
			fail(42*sec, 41*sec, Restarting, 2*sec, ""),
			fail(42*sec+1, 42*sec, CrashLoopBackoff, 4*sec, "restart 3 in a row"),
		}},
		{"a quiet incarnation in a full window loops again", Policy{MaxRestarts: 1, Period: time.Hour, Backoff: Backoff{Min: sec, CrashLoopMax: 8 * sec, Jitter: -1, Reset: sec}}, []step{
			fail(0, 0, Restarting, 1*sec, ""),
			fail(2*sec, 2*sec, CrashLoopBackoff, 2*sec, ""),
			fail(10*sec, 5*sec, CrashLoopBackoff, 1*sec, "restart 1 in a row"), // fresh streak, still over
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { run(t, tc.pol, tc.steps) })
	}
}

// callDeaths is n deaths, 1 ms apart, of incarnations that had become ready, each while it
// ran a call: restarted at once and uncounted, or (counted) as crashLoopSteps.
func callDeaths(n int, counted bool) []step {
	var steps []step
	for i, at := range fastFailures(n) {
		st := step{at: at, up: at, end: End{Err: &lifecycle.Error{Code: lifecycle.CodeWorkerCrashed}, Running: true},
			want: Restarting, reason: "died running a call"}
		if counted {
			want := crashLoopSteps()[i]
			st.want, st.delay, st.reason = want.want, want.delay, ""
		}
		steps = append(steps, st)
	}
	return steps
}

// bootFailures is n failed starts in a row, 1 ms apart: the default backoff, then crash-loop
// backoff past 5 restarts, as for crashes.
func bootFailures(n int) []step {
	steps := crashLoopSteps()[:n]
	for i := range steps {
		steps[i].up = -1
		steps[i].end = End{Err: &lifecycle.Error{Code: lifecycle.CodeStartupFailed}}
	}
	return steps
}

func crashLoopSteps() []step {
	want := []struct {
		s State
		d time.Duration
	}{
		{Restarting, 1 * ms}, {Restarting, 2 * ms}, {Restarting, 4 * ms}, {Restarting, 8 * ms}, {Restarting, 16 * ms},
		{CrashLoopBackoff, 32 * ms}, {CrashLoopBackoff, 64 * ms}, {CrashLoopBackoff, 128 * ms},
	}
	var steps []step
	for i, at := range fastFailures(len(want)) {
		steps = append(steps, fail(at, at, want[i].s, want[i].d, ""))
	}
	// then on, the failures spaced by their delays: far past the window, still looping
	at, d := 10*sec, 256*ms
	for range 10 {
		steps = append(steps, fail(at, at, CrashLoopBackoff, d, "crash loop"))
		at += d + ms
		d = min(2*d, time.Minute) // the cap
	}
	return steps
}

func TestDecideJitter(t *testing.T) {
	pol := Policy{Backoff: Backoff{Min: 100 * ms, Jitter: 0.5}}.WithDefaults()
	for _, r := range []float64{0, 0.5, 0.999} {
		d, _ := Decide(pol, History{}, Failure{End: crash()}, epoch, []bool{true}, r)
		if want := 100*ms + time.Duration(float64(100*ms)*0.5*r); d.Delay != want {
			t.Errorf("r=%v: delay %v, want %v", r, d.Delay, want)
		}
	}
}

func TestDecideGroups(t *testing.T) {
	pol := Policy{}.WithDefaults()
	for _, tc := range []struct {
		s    Strategy
		live []bool
		want string
	}{
		{OneForOne, []bool{true, true, true, true}, "[2]"},
		{AllForOne, []bool{true, true, true, true}, "[0 1 2 3]"},
		{RestForOne, []bool{true, true, true, true}, "[2 3]"},
		// lanes not live (stopping for, or waiting on, another restart, or dead) stay out
		{AllForOne, []bool{false, true, false, true}, "[1 2 3]"},
		{RestForOne, []bool{true, true, true, false}, "[2]"},
	} {
		pol.Strategy = tc.s
		d, _ := Decide(pol, History{}, Failure{Lane: 2, End: crash()}, epoch, tc.live, 0)
		if fmt.Sprint(d.Group) != tc.want {
			t.Errorf("%v with live %v: group %v, want %s", tc.s, tc.live, d.Group, tc.want)
		}
	}
}

// The window is bounded by the intensity, whatever the number of failures.
func TestDecideWindowBounded(t *testing.T) {
	pol := Policy{Period: time.Hour}.WithDefaults()
	var h History
	for i := range 1000 {
		_, h = Decide(pol, h, Failure{End: crash()}, epoch.Add(time.Duration(i)*sec), []bool{true}, 0)
	}
	if len(h.Failures) != pol.MaxRestarts+1 || !h.Looping || h.Streak != 1000 {
		t.Errorf("history after 1000 failures: %d failures, looping %v, streak %d", len(h.Failures), h.Looping, h.Streak)
	}
}
