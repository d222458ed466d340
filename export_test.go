package knit

// NewUnsupervisedPool starts a pool whose lanes run without a supervision tree, for the
// benchmark that shows the tree costs the call path nothing.
func NewUnsupervisedPool(cfg Config, tasks ...Definition) (*Pool, error) {
	return newPool(cfg, false, tasks...)
}

// AwaitSpares waits until the spares being started have initialised (or failed).
func AwaitSpares(p *Pool) { p.spares.wg.Wait() }

// LaneDebug is the KNIT_DEBUG value the pool's process lanes get.
func LaneDebug(p *Pool) string { return p.laneDebug }

// TaskIndex is a task's registry index (hostile tests forge slots naming it).
func TaskIndex[In, Out any](t *Task[In, Out]) uint32 { return t.def.Index() }
