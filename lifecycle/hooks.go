package lifecycle

import "go.opentelemetry.io/otel/propagation"

// Hooks are what a lane binary's knit.Main gives its lanes.
type Hooks struct {
	// Propagator puts the context values a caller's pool carried (Config.Propagator on the
	// host) into each task's context, e.g. propagation.TraceContext{} so that a trace goes on
	// in the lane. Without it, carried values are ignored.
	Propagator propagation.TextMapPropagator
	// DeadlineCause and CanceledCause are context.Cause of a task's context when its
	// caller's deadline passed or its caller gave up (knit.ErrCallerDeadline and
	// knit.ErrCallerCanceled); nil: ErrCallerDeadline and ErrCallerCanceled of this package.
	DeadlineCause, CanceledCause error
}
