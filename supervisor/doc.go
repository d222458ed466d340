// Package supervisor is the supervision tree of a knit pool, built on protoactor-go: one pool
// actor with one lane actor per lane. A lane actor starts, watches, stops and classifies one
// lane incarnation after another; the pool actor is the parent's SupervisorStrategy and
// carries out the restart decision (restart type, OneForOne / AllForOne / RestForOne, restart
// intensity, exponential backoff with jitter, and past the intensity crash-loop backoff by
// default or, the OTP way, giving the lane up). The decision itself is Decide, a pure
// function that takes time as an input. A lane actor is the only writer of its lane's state:
// it records the pool actor's decisions too (restarting, crash_loop_backoff, dead), which
// reach it through protoactor's restart and stop.
//
// The package only ever sees lanes through the Host and Worker interfaces, and time only
// through Config.Clock. It must never touch a lane's shared memory or a call: call data stays
// on the fast path and out of mailboxes.
package supervisor
