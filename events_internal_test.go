package knit

import (
	"testing"

	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/supervisor"
)

// TestEnumsMatchTheirLayers: knit's enums convert to and from the layers' by value
// (eventOf, Restart.policy, Sandbox.lane), so each constant must name the same thing there.
func TestEnumsMatchTheirLayers(t *testing.T) {
	states := map[State]supervisor.State{
		StateBooting: supervisor.Booting, StateReady: supervisor.Ready, StateStopping: supervisor.Stopping,
		StateClosed: supervisor.Closed, StateCrashed: supervisor.Crashed, StateExited: supervisor.Exited,
		StateStartupFailed: supervisor.StartupFailed, StateRestarting: supervisor.Restarting, StateDead: supervisor.Dead,
		StateFailed: supervisor.Failed, StateNew: supervisor.New, StateCrashLoopBackoff: supervisor.CrashLoopBackoff,
		StateRecycling: supervisor.Recycling, StateRetiring: supervisor.Retiring, StateRemoved: supervisor.Removed,
	}
	for k, v := range states {
		if int(k) != int(v) || k.String() != v.String() {
			t.Errorf("State %v (%d) vs supervisor %v (%d)", k, k, v, v)
		}
	}
	if got := supervisor.State(len(states)).String(); got != "state(15)" {
		t.Errorf("the supervisor has a state knit lacks: %s", got)
	}
	pairs := []struct {
		name     string
		knit, of int
	}{
		{"Transient", int(Transient), int(supervisor.Transient)},
		{"Permanent", int(Permanent), int(supervisor.Permanent)},
		{"Temporary", int(Temporary), int(supervisor.Temporary)},
		{"OneForOne", int(OneForOne), int(supervisor.OneForOne)},
		{"AllForOne", int(AllForOne), int(supervisor.AllForOne)},
		{"RestForOne", int(RestForOne), int(supervisor.RestForOne)},
		{"CrashLoop", int(CrashLoop), int(supervisor.CrashLoop)},
		{"GiveUp", int(GiveUp), int(supervisor.GiveUp)},
		{"SandboxOff", int(SandboxOff), int(lifecycle.SandboxOff)},
		{"SandboxBestEffort", int(SandboxBestEffort), int(lifecycle.SandboxBestEffort)},
		{"SandboxRequired", int(SandboxRequired), int(lifecycle.SandboxRequired)},
	}
	for _, p := range pairs {
		if p.knit != p.of {
			t.Errorf("%s: knit %d, its layer %d", p.name, p.knit, p.of)
		}
	}
	codes := map[Code]lifecycle.Code{
		CodePoolClosed: lifecycle.CodePoolClosed, CodeTimeout: lifecycle.CodeTimeout, CodeTaskPanic: lifecycle.CodeTaskPanic,
		CodeTaskError: lifecycle.CodeTaskError, CodePayloadTooLarge: lifecycle.CodePayloadTooLarge,
		CodeOverloaded: lifecycle.CodeOverloaded, CodeUnsupportedType: lifecycle.CodeUnsupportedType,
		CodePoolUnavailable: lifecycle.CodePoolUnavailable, CodeCanceled: lifecycle.CodeCanceled,
		CodeThreadClosed: lifecycle.CodeThreadClosed, CodeWorkerCrashed: lifecycle.CodeWorkerCrashed,
		CodeWorkerExited: lifecycle.CodeWorkerExited, CodeStartupFailed: lifecycle.CodeStartupFailed,
		CodeUnresponsive: lifecycle.CodeWorkerUnresponsive, CodePoisonCall: lifecycle.CodePoisonCall,
		CodeOutOfMemory: lifecycle.CodeWorkerOutOfMemory, CodeCPULimit: lifecycle.CodeWorkerCPULimit,
		CodeNodeLost: lifecycle.CodeNodeLost,
	}
	for k, v := range codes {
		if string(k) != string(v) {
			t.Errorf("code %s vs lifecycle %s", k, v)
		}
	}
	// A lower layer's error converts, and matches knit's sentinels either way.
	le := &lifecycle.Error{Code: lifecycle.CodeWorkerCrashed, Lane: 2, Task: "t", Message: "m", Started: true}
	e, ok := errorOf(le).(*Error)
	if !ok || e.Code != CodeWorkerCrashed || e.Lane != 2 || !e.Started || !e.Is(ErrWorkerCrashed) || !le.Is(ErrWorkerCrashed) {
		t.Errorf("converted %+v", e)
	}
}
