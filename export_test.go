package knit

import "github.com/knitgo/knit/internal/pool"

// The implementation's test hooks (internal/pool/testing.go), under the names the tests use.
var (
	NewUnsupervisedPool   = pool.NewUnsupervisedPool
	NewPoolWithoutMonitor = pool.NewPoolWithoutMonitor
	AwaitSpares           = pool.AwaitSpares
	LaneDebug             = pool.LaneDebug
	NewResultHarness      = pool.NewResultHarness
	StealState            = pool.StealState
	StopStealBackstop     = pool.StopStealBackstop
	StealAlways           = pool.StealAlways
	StealAwake            = pool.StealAwake
	SetTicketWidth        = pool.SetTicketWidth
)

// ResultHarness is the host side of one process lane with no process behind it.
type ResultHarness = pool.ResultHarness

// TaskIndex is a task's registry index (hostile tests forge slots naming it).
func TaskIndex[In, Out any](t *Task[In, Out]) uint32 { return pool.TaskIndex(t) }
