package lifecycle

import (
	"syscall"
	"time"

	"go.uber.org/zap"
)

// A Stop is the host's side of the stop protocol for one lane incarnation, from the moment
// the host has set the lane's stop word to requested and woken it: wait AckTimeout for the
// lane to acknowledge (or end), then escalate as its runtime allows. A process that did not
// acknowledge gets SIGTERM, then SIGKILL after KillGrace; one that acknowledged but has not
// ended within KillGrace gets SIGKILL. A goroutine cannot be killed: one that did not
// acknowledge is abandoned.
//
// The two runtimes differ only in Signal: a process lane's group (Process.Signal), or nil
// for a goroutine lane, which Abandon gives up on instead.
type Stop struct {
	AckTimeout time.Duration   // how long the lane has to acknowledge (Config.StopAckTimeout)
	KillGrace  time.Duration   // how long a signalled or acknowledging process has to end
	Acked      <-chan struct{} // closed when the lane has acknowledged
	Ended      <-chan struct{} // closed when the lane has ended and its calls are settled
	// Signal sends sig to the lane's process group; nil for a lane that is no process.
	Signal func(sig syscall.Signal)
	// Abandon fences a lane that cannot be signalled and did not acknowledge, and settles
	// its calls: Ended is closed when it returns.
	Abandon func()
	// Debug logs a step of the protocol (the lane namespace, with the lane's identity).
	Debug func(msg string, fields ...zap.Field)
	// TimedOut and Killed, when set, count a stop not acknowledged in time and a signal sent,
	// with its reason ("stop_timeout", "exit_timeout"), for the pool's metrics.
	TimedOut func()
	Killed   func(signal, reason string)
}

// Run escalates until the lane has ended, and reports whether it acknowledged (or ended)
// within AckTimeout.
func (s Stop) Run() bool {
	acked := waitFor(s.AckTimeout, s.Ended, s.Acked)
	switch {
	case s.Signal == nil && !acked:
		s.timedOut()
		s.debug("stop not acknowledged: abandoning the lane", zap.Duration("waited", s.AckTimeout))
		s.Abandon()
	case !acked:
		s.debug("stop not acknowledged: SIGTERM to the process group", zap.Duration("waited", s.AckTimeout))
		s.timedOut()
		s.killed("SIGTERM", "stop_timeout")
		s.Signal(syscall.SIGTERM)
		if !waitFor(s.KillGrace, s.Ended) {
			s.debug("still running after SIGTERM: SIGKILL", zap.Duration("grace", s.KillGrace))
			s.killed("SIGKILL", "stop_timeout")
			s.Signal(syscall.SIGKILL)
		}
	case s.Signal != nil:
		s.debug("stop acknowledged")
		// Acknowledged: the process is on its way out. One that never gets there is
		// still reaped.
		if !waitFor(s.KillGrace, s.Ended) {
			s.debug("acknowledged but still running: SIGKILL", zap.Duration("grace", s.KillGrace))
			s.killed("SIGKILL", "exit_timeout")
			s.Signal(syscall.SIGKILL)
		}
	default:
		s.debug("stop acknowledged")
	}
	<-s.Ended
	return acked
}

func (s Stop) debug(msg string, fields ...zap.Field) {
	if s.Debug != nil {
		s.Debug(msg, fields...)
	}
}

func (s Stop) timedOut() {
	if s.TimedOut != nil {
		s.TimedOut()
	}
}

func (s Stop) killed(signal, reason string) {
	if s.Killed != nil {
		s.Killed(signal, reason)
	}
}

// waitFor reports whether one of cs closed within d.
func waitFor(d time.Duration, cs ...<-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for len(cs) < 2 {
		cs = append(cs, nil)
	}
	select {
	case <-cs[0]:
		return true
	case <-cs[1]:
		return true
	case <-t.C:
		return false
	}
}

// AwaitReady waits for ready (closed once the host has seen the lane report ready), for
// ended (the lane's end has been classified), or for timeout, at which it kills the process
// (Exit.Startup) and waits for ended. It reports whether the lane became ready.
func (p *Process) AwaitReady(ready, ended <-chan struct{}, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		return true
	case <-ended:
	case <-t.C:
		p.Kill(Exit{Startup: timeout})
		<-ended
	}
	return false
}
