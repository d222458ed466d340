package supervisor

import (
	"fmt"
	"time"

	"github.com/knitgo/knit/lifecycle"
)

// RestartType says which ends of a lane bring it back, as in OTP.
type RestartType int

// Restart types.
const (
	Transient RestartType = iota // restart after a crash or an exit with a non-zero status (default)
	Permanent                    // restart after any end the host did not ask for, exit 0 included
	Temporary                    // never restart
)

func (t RestartType) String() string {
	switch t {
	case Permanent:
		return "permanent"
	case Temporary:
		return "temporary"
	}
	return "transient"
}

// Strategy says which lanes restart together.
type Strategy int

// Strategies.
const (
	OneForOne  Strategy = iota // only the lane that failed (default)
	AllForOne                  // every lane: the others are stopped first
	RestForOne                 // the lane that failed and every lane started after it
)

func (s Strategy) String() string {
	switch s {
	case AllForOne:
		return "all-for-one"
	case RestForOne:
		return "rest-for-one"
	}
	return "one-for-one"
}

// IntensityAction says what becomes of a lane that exceeds its restart intensity.
type IntensityAction int

// Intensity actions.
const (
	CrashLoop IntensityAction = iota // crash-loop backoff (knit.CrashLoop)
	GiveUp                           // the lane is given up (knit.GiveUp)
)

func (a IntensityAction) String() string {
	if a == GiveUp {
		return "give-up"
	}
	return "crash-loop"
}

// Backoff spaces restarts, as knit.Backoff documents it (fields and defaults alike).
type Backoff struct {
	Min, Max     time.Duration
	Jitter       float64
	Reset        time.Duration
	CrashLoopMax time.Duration
}

// Policy is a pool's supervision policy, as knit.Restart documents it (fields and defaults
// alike); WithDefaults fills in the defaults.
type Policy struct {
	Type            RestartType
	Strategy        Strategy
	MaxRestarts     int
	Period          time.Duration
	OnIntensity     IntensityAction
	Backoff         Backoff
	CountCallDeaths bool
}

// Defaults.
const (
	DefaultMaxRestarts  = 5
	DefaultPeriod       = 10 * time.Second
	DefaultBackoffMin   = time.Millisecond
	DefaultBackoffMax   = 2 * time.Second
	DefaultJitter       = 0.1
	DefaultCrashLoopMax = time.Minute
)

// WithDefaults fills in the documented defaults. Apply it once: a negative Min or Jitter
// becomes zero, which a second application would read as unset.
func (p Policy) WithDefaults() Policy {
	if p.MaxRestarts == 0 {
		p.MaxRestarts = DefaultMaxRestarts
	}
	if p.Period <= 0 {
		p.Period = DefaultPeriod
	}
	b := &p.Backoff
	switch {
	case b.Min == 0:
		b.Min = DefaultBackoffMin
	case b.Min < 0:
		b.Min = 0
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoffMax
	}
	b.Max = max(b.Max, b.Min)
	if b.CrashLoopMax <= 0 {
		b.CrashLoopMax = DefaultCrashLoopMax
	}
	b.CrashLoopMax = max(b.CrashLoopMax, b.Max)
	switch {
	case b.Jitter == 0:
		b.Jitter = DefaultJitter
	case b.Jitter < 0:
		b.Jitter = 0
	case b.Jitter > 1:
		b.Jitter = 1
	}
	if b.Reset <= 0 {
		b.Reset = p.Period
	}
	return p
}

// Delay is the wait before the n-th restart in a row (n ≥ 1); r is a random number in [0,1).
func (b Backoff) Delay(n int, r float64) time.Duration { return b.delay(n, r, b.Max) }

// CrashLoopDelay is the wait before the n-th restart in a row of a lane in crash-loop backoff.
func (b Backoff) CrashLoopDelay(n int, r float64) time.Duration {
	return b.delay(n, r, b.CrashLoopMax)
}

func (b Backoff) delay(n int, r float64, limit time.Duration) time.Duration {
	d := b.Min
	if d <= 0 {
		return 0
	}
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return d + time.Duration(float64(d)*b.Jitter*r)
}

// End is how a lane incarnation ended.
type End struct {
	Err    *lifecycle.Error // the classified end
	Normal bool             // it ended on its own with success (exit status 0, or its goroutine returned)
	// Running: a call had started on the incarnation and not finished when it ended (and
	// the end is one a call can cause: not a stop, a failed start or a frozen lane).
	Running bool
}

// ShouldRestart reports whether a lane that ended so is restarted under t. An end the host
// asked for (THREAD_CLOSED) never is.
func ShouldRestart(t RestartType, e End) bool {
	switch {
	case t == Temporary, e.Err != nil && e.Err.Code == lifecycle.CodeThreadClosed:
		return false
	case t == Permanent:
		return true
	}
	return !e.Normal
}

// stateOf is the state a lane is in after it ended with code.
func stateOf(c lifecycle.Code) State {
	switch c {
	case lifecycle.CodeThreadClosed:
		return Closed
	case lifecycle.CodeStartupFailed:
		return StartupFailed
	case lifecycle.CodeWorkerExited:
		return Exited
	}
	return Crashed
}

// State is where a lane is in its life.
type State int

// States, as knit.State documents them (knit's StateBooting … StateRemoved have these
// values).
const (
	Booting State = iota
	Ready
	Stopping
	Closed
	Crashed
	Exited
	StartupFailed
	Restarting
	Dead
	Failed
	New
	CrashLoopBackoff
	Recycling
	Retiring
	Removed
)

var stateNames = [...]string{"booting", "ready", "stopping", "closed", "crashed", "exited", "startup_failed", "restarting", "dead", "failed", "new", "crash_loop_backoff", "recycling", "retiring", "removed"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// MarshalText names the state (JSON carries "ready", not 1).
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a state's name, or state(N) for one without a name.
func (s *State) UnmarshalText(b []byte) error {
	for i, name := range stateNames {
		if string(b) == name {
			*s = State(i)
			return nil
		}
	}
	var n int
	if _, err := fmt.Sscanf(string(b), "state(%d)", &n); err != nil {
		return fmt.Errorf("supervisor: unknown state %q", b)
	}
	*s = State(n)
	return nil
}

// Event is one lifecycle transition.
type Event struct {
	Lane        int // -1 for the pool
	Incarnation int // 0 for a lane's first start
	From, To    State
	Code        lifecycle.Code // the classified end, when the transition is one
	Reason      string
	Delay       time.Duration // with To == Restarting or CrashLoopBackoff: the wait before the restart
	Time        time.Time
}
