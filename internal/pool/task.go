package pool

import "github.com/knitgo/knit/actors"

// Task is a typed task definition made by knit.Define.
type Task[In, Out any] struct {
	def *actors.Task[In, Out]
}

// NewTask is knit.Define's task around its registered definition.
func NewTask[In, Out any](def *actors.Task[In, Out]) *Task[In, Out] { return &Task[In, Out]{def: def} }

// Name returns the task's name.
func (t *Task[In, Out]) Name() string { return t.def.Name() }

// Fingerprint identifies the task's name and In/Out types; host and process lanes compare
// fingerprints at boot.
func (t *Task[In, Out]) Fingerprint() uint64 { return t.def.Fingerprint() }

func (t *Task[In, Out]) actorsDef() actors.Def {
	if t == nil || t.def == nil { // a nil *Task, or a Task not made by Define
		return nil
	}
	return t.def
}
