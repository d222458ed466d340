package knit

import (
	"time"

	"github.com/knitgo/knit/supervisor"
)

// Restart is a pool's supervision policy (Config.Restart): which ends of a lane bring it
// back, which lanes restart together, how often and how soon. The zero value restarts a
// crashed lane on its own (Transient, OneForOne) after 1ms, 2ms, 4ms … 2s; a lane that
// restarts more than 5 times in 10s is in crash-loop backoff, its restarts doubling up to
// 1min (logged at Error), until one incarnation serves for 10s. docs/lifecycle.md has the
// rules.
type Restart struct {
	// Type says which ends restart a lane (default Transient).
	Type RestartType
	// Strategy says which lanes restart with it (default OneForOne).
	Strategy Strategy
	// MaxRestarts is how many restarts a lane may have within Period before OnIntensity
	// applies (default 5; negative: no limit).
	MaxRestarts int
	// Period is the intensity window (default 10s).
	Period time.Duration
	// OnIntensity is what happens to a lane that exceeds its intensity: CrashLoop (default)
	// or GiveUp.
	OnIntensity IntensityAction
	// Backoff spaces the restarts.
	Backoff Backoff
	// CountCallDeaths counts a lane's death while it ran a call like any other failure,
	// toward MaxRestarts and crash-loop backoff, as OTP would. By default such a death, of
	// an incarnation that had booted, restarts the lane at once and is not counted: the
	// call hurt the lane, the lane is not sick, and punishing it would starve the innocent
	// calls of lanes (docs/lifecycle.md, "Serving untrusted input"). The call is blamed
	// instead: it fails with the lane's code (an Idempotent one runs once more, then fails
	// POISON_CALL), and Stats.Tasks counts the lanes each task's calls killed. Deaths at
	// boot, while idle, or of a frozen lane count as ever.
	CountCallDeaths bool
}

// Backoff spaces restarts: the n-th restart in a row waits min(Max, Min·2ⁿ⁻¹), plus up to
// Jitter of that at random; a lane in crash-loop backoff waits min(CrashLoopMax, Min·2ⁿ⁻¹)
// instead. A lane whose incarnation served for Reset before it failed counts as fresh again:
// the count starts over and it leaves crash-loop backoff.
type Backoff struct {
	Min    time.Duration // first delay (default 1ms; negative: no delay, in crash-loop backoff too)
	Max    time.Duration // cap before jitter (default 2s)
	Jitter float64       // fraction added at random, in [0,1] (default 0.1; negative: none)
	Reset  time.Duration // quiet period after which the count starts over (default Period)
	// CrashLoopMax is the cap, before jitter, of a crash-looping lane's delay (default 1min,
	// at least Max). A minute keeps a lane that dies at once from costing more than a start
	// a minute, yet brings it back within a minute of the cause going away.
	CrashLoopMax time.Duration
}

// RestartType says which ends of a lane bring it back, as in OTP.
type RestartType int

// Restart types.
const (
	Transient RestartType = iota // restart after a crash or an exit with a non-zero status (default)
	Permanent                    // restart after any end the host did not ask for, exit 0 included
	Temporary                    // never restart
)

func (t RestartType) String() string { return supervisor.RestartType(t).String() }

// Strategy says which lanes restart together, as in OTP.
type Strategy int

// Strategies.
const (
	OneForOne  Strategy = iota // only the lane that failed (default)
	AllForOne                  // every lane: the others are stopped first
	RestForOne                 // the lane that failed and every lane started after it
)

func (s Strategy) String() string { return supervisor.Strategy(s).String() }

// IntensityAction says what becomes of a lane that exceeds its restart intensity.
type IntensityAction int

// Intensity actions (Restart.OnIntensity).
const (
	// CrashLoop (default) keeps restarting the lane, ever more slowly: it is in crash-loop
	// backoff, its restarts spaced exponentially up to Backoff.CrashLoopMax, until an
	// incarnation serves for Backoff.Reset, the way Kubernetes treats a crash-looping
	// container. A pool then never fails because lanes crash too often.
	CrashLoop IntensityAction = iota
	// GiveUp gives the lane up (dead), as OTP does; once no lane is left the pool has failed
	// and Config.Parent is told.
	GiveUp
)

func (a IntensityAction) String() string { return supervisor.IntensityAction(a).String() }

// policy is r as the supervisor takes it. The enums have the supervisor's values
// (TestEnumsMatchTheirLayers).
func (r Restart) policy() supervisor.Policy {
	b := r.Backoff
	return supervisor.Policy{
		Type: supervisor.RestartType(r.Type), Strategy: supervisor.Strategy(r.Strategy),
		MaxRestarts: r.MaxRestarts, Period: r.Period, OnIntensity: supervisor.IntensityAction(r.OnIntensity),
		CountCallDeaths: r.CountCallDeaths,
		Backoff:         supervisor.Backoff{Min: b.Min, Max: b.Max, Jitter: b.Jitter, Reset: b.Reset, CrashLoopMax: b.CrashLoopMax},
	}
}

// WithDefaults returns r with the documented defaults filled in, as a pool applies them
// (Pool.Config keeps what the pool was given). Apply it once: a negative Backoff.Min or
// Jitter becomes zero, which a second application would read as unset.
func (r Restart) WithDefaults() Restart {
	p := r.policy().WithDefaults()
	b := p.Backoff
	return Restart{
		Type: RestartType(p.Type), Strategy: Strategy(p.Strategy), MaxRestarts: p.MaxRestarts, Period: p.Period,
		OnIntensity: IntensityAction(p.OnIntensity), CountCallDeaths: p.CountCallDeaths,
		Backoff: Backoff{Min: b.Min, Max: b.Max, Jitter: b.Jitter, Reset: b.Reset, CrashLoopMax: b.CrashLoopMax},
	}
}
