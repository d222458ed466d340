package knit

import (
	"fmt"

	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/remote"
)

// Runtime says what a lane is.
type Runtime int

// Runtimes.
const (
	Goroutine Runtime = iota // a goroutine in the host process (default)
	Process                  // a child OS process of the same binary, or Config.Process.Command
	Remote                   // a lane on another machine's node (ServeNode), Config.Remote; docs/remote.md
)

// runtimes is where a pool picks the implementation of its Runtime: what its lanes can do
// (the pool asks lifecycle.Caps, never the runtime's name) and how the pool opens them. A
// runtime is one implementation of lifecycle.Runtime and one line here.
var runtimes = [...]struct {
	caps lifecycle.Caps
	open func(*Pool) (lifecycle.Runtime, error)
}{
	Goroutine: {lifecycle.Goroutines{}.Caps(), (*Pool).openGoroutines},
	Process:   {(*lifecycle.Processes)(nil).Caps(), (*Pool).openProcesses},
	Remote:    {(*remote.Nodes)(nil).Caps(), (*Pool).openRemote},
}

// openGoroutines readies a pool of goroutine lanes.
func (p *Pool) openGoroutines() (lifecycle.Runtime, error) {
	inline := p.cfg.Payload.Inline
	if p.local {
		inline = 64 // a LocalLane uses its region's stop word and counters, not its rings
	}
	p.memory = "heap"
	return lifecycle.Goroutines{Inline: inline, Epoch: p.epoch.UnixNano()}, nil
}

func (r Runtime) String() string {
	switch r {
	case Goroutine:
		return "goroutine"
	case Process:
		return "process"
	case Remote:
		return "remote"
	}
	return fmt.Sprintf("Runtime(%d)", int(r))
}

// MarshalText names the runtime (JSON carries "process", not 1).
func (r Runtime) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a runtime's name.
func (r *Runtime) UnmarshalText(b []byte) error {
	switch string(b) {
	case "goroutine":
		*r = Goroutine
	case "process":
		*r = Process
	case "remote":
		*r = Remote
	default:
		return fmt.Errorf("knit: unknown runtime %q", b)
	}
	return nil
}
