package supervisor

import (
	"fmt"
	"slices"
	"time"
)

// History is what the supervisor remembers of a lane across its incarnations: the part of a
// restart decision that outlives one failure. Decide returns the next one.
type History struct {
	// Failures are the times of the failures that led to a restart within the intensity
	// window, oldest first.
	Failures []time.Time
	// Streak counts the restarts in a row: the backoff's n.
	Streak int
	// Looping is set while the lane is in crash-loop backoff: from the failure that
	// exceeded its intensity until an incarnation serves for Backoff.Reset.
	Looping bool
}

// Decision is what the supervisor does about one lane failure.
type Decision struct {
	// To is Restarting, CrashLoopBackoff (restart after Delay) or Dead (give the lane up).
	To     State
	Reason string
	Delay  time.Duration
	// Group lists the lanes that restart together, in start order, the failed one included:
	// the others are live lanes the strategy takes along, to be stopped first. Nil when To
	// is Dead.
	Group []int
}

// Decide is the restart decision on failure f, a pure function: pol (with its defaults
// applied), the lane's history h, the time now, which lanes are live (one entry per lane;
// live is booting or serving, not stopping, waiting for a restart or dead) and a random
// number r in [0,1) for the jitter are all it reads; it starts no timer, sends nothing and
// looks at no clock. It returns the decision and the lane's next history (h is left as it
// was), the way etcd's raft takes time only as input: table tests drive it on a fake clock.
//
// In order: a lane whose end its RestartType does not restart is given up. A lane whose
// incarnation had become ready and died running a call (End.Running) restarts at once,
// its history unchanged, unless pol.CountCallDeaths. Otherwise the
// failure joins the intensity window (failures older than Period leave it); a lane whose
// failed incarnation had served for Backoff.Reset first counts as fresh (its streak starts
// over and it leaves crash-loop backoff). More than MaxRestarts failures in the window exceed
// the intensity: under GiveUp the lane is given up, under CrashLoop it enters crash-loop
// backoff. Then the streak grows by one and the delay follows it, capped by Backoff.Max, or
// Backoff.CrashLoopMax in crash-loop backoff.
func Decide(pol Policy, h History, f Failure, now time.Time, live []bool, r float64) (Decision, History) {
	if !ShouldRestart(pol.Type, f.End) {
		return Decision{To: Dead, Reason: fmt.Sprintf("not restarted (%s lane)", pol.Type)}, h
	}
	if f.End.Running && !f.Up.IsZero() && !pol.CountCallDeaths {
		// The incarnation booted and served, and died running a call: the call hurt it, the
		// lane is not sick. It restarts at once, and the death is the call's (poison
		// detection), not a step toward crash-loop backoff.
		return Decision{To: Restarting, Reason: "died running a call: restarted at once, not counted toward the restart intensity",
			Group: restartGroup(pol.Strategy, f.Lane, live)}, h
	}
	next := History{Failures: make([]time.Time, 0, len(h.Failures)+1), Streak: h.Streak, Looping: h.Looping}
	for _, at := range h.Failures {
		if now.Sub(at) < pol.Period {
			next.Failures = append(next.Failures, at)
		}
	}
	next.Failures = append(next.Failures, now)
	if pol.MaxRestarts >= 0 && len(next.Failures) > pol.MaxRestarts+1 {
		// Only whether the window holds more than MaxRestarts matters: keep it bounded.
		next.Failures = slices.Delete(next.Failures, 0, len(next.Failures)-pol.MaxRestarts-1)
	}
	// The failure carries its ready time: the supervisor hears of a lane's readiness no
	// other way.
	if !f.Up.IsZero() && now.Sub(f.Up) >= pol.Backoff.Reset {
		next.Streak, next.Looping = 0, false
	}
	over := pol.MaxRestarts >= 0 && len(next.Failures) > pol.MaxRestarts
	if over && pol.OnIntensity == GiveUp {
		return Decision{To: Dead, Reason: fmt.Sprintf("restart intensity reached: %d restarts within %v", pol.MaxRestarts, pol.Period)}, next
	}
	next.Looping = next.Looping || over
	next.Streak++
	d := Decision{To: Restarting, Group: restartGroup(pol.Strategy, f.Lane, live)}
	if next.Looping {
		d.To, d.Delay = CrashLoopBackoff, pol.Backoff.CrashLoopDelay(next.Streak, r)
		d.Reason = fmt.Sprintf("crash loop: restart %d in a row, past %d restarts within %v; waiting %v",
			next.Streak, pol.MaxRestarts, pol.Period, d.Delay)
		return d, next
	}
	d.Delay = pol.Backoff.Delay(next.Streak, r)
	d.Reason = fmt.Sprintf("restart %d within %v", len(next.Failures), pol.Period)
	return d, next
}

// restartGroup is the lanes that restart with lane under strategy s, in start order.
func restartGroup(s Strategy, lane int, live []bool) []int {
	g := []int{}
	for i, l := range live {
		switch {
		case i == lane:
		case s == OneForOne, s == RestForOne && i < lane, !l:
			continue
		}
		g = append(g, i)
	}
	return g
}
