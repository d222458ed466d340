// Package knit runs typed task actors on supervised worker lanes. A lane is a goroutine in
// the host process or a separate OS process; calls and results move between host and lane
// through a shared-memory fast path (slot rings and doorbells), never through actor
// mailboxes, while a supervision tree of protoactor-go actors owns every lane's life.
//
// # Usage
//
// Define tasks once, at package level, so that the host and every process lane build the
// same registry during init; start a pool that serves them; call them:
//
//	var Add = knit.Define("add", func(ctx context.Context, in [2]int64) (int64, error) {
//		return in[0] + in[1], nil
//	})
//
//	func main() {
//		knit.Main() // first: in a process started as a lane, it serves and exits
//		pool, err := knit.NewPool(knit.Config{Lanes: 4}, Add)
//		if err != nil {
//			log.Fatal(err)
//		}
//		defer pool.Close(context.Background())
//		sum, err := Add.Call(ctx, pool, [2]int64{1, 2})
//	}
//
// Task.Call waits for the result; Task.Go returns a Future at once. The zero Config is a
// pool of GOMAXPROCS goroutine lanes with knit's defaults; every field documents its own.
//
// # Process lanes
//
// With Config.Runtime set to Process, each lane is a child process of the same binary (or
// of ProcessConfig.Command), booted over a sealed memfd region: a task that panics the
// runtime, calls os.Exit, runs out of memory or is killed costs that lane, not the host.
// Inputs and results are encoded with the task's codecs (chosen at Define; WithCodec
// replaces one) under per-call size limits, and NewPool refuses types that would not cross
// intact. ProcessConfig holds spares started ahead for restarts, resource Limits (rlimits,
// or a cgroup per lane), a Sandbox (Landlock and seccomp) and the command's Prefix.
// docs/process-lanes.md has the boot protocol, the codec rules and the threat model.
//
// # Supervision
//
// A lane that ends without being asked to costs only the call it was running: that call
// fails with the classified code (WORKER_CRASHED, WORKER_EXITED, WORKER_UNRESPONSIVE, …),
// or runs once more on a live lane if its task is Idempotent; the calls the lane held that
// had not started run elsewhere. Config.Restart then decides the lane's fate the way OTP
// does (restart types, strategies, intensity, backoff), except that past its intensity a
// lane is by default in crash-loop backoff rather than given up. Every transition is an
// Event, on Pool.Events or Config.OnEvent, and is logged through zap. docs/lifecycle.md has
// the states and rules.
//
// # Errors
//
// Every call settles, resolved or rejected, whatever happens to its lane. Every failure is
// a *Error with a Code; errors.Is(err, knit.ErrTimeout) and the other sentinels match by
// code, and errors.As gives the lane, the task, and whether the call had started. A
// panicking task's Cause is a *PanicError, whose stack stays out of Error().
//
// # Operating
//
// Pool.Stats describes every lane; Config.MeterProvider receives OpenTelemetry metrics;
// package inspect serves a live inspector page. Pool.Resize changes the number of lanes,
// and MaxCallsPerLane and ProcessConfig.MaxLaneMemory recycle lanes, without losing a
// call. docs/operating.md describes them; docs/architecture.md describes the packages
// below this one and the path of a call through them.
package knit
