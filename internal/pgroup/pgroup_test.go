package pgroup

import (
	"os/exec"
	"syscall"
	"testing"
)

// TestSignalGroup: a child started with Attr leads its own group, and Signal ends it
// through that group.
func TestSignalGroup(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = Attr()
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to start: %v", err)
	}
	if pgid, err := syscall.Getpgid(cmd.Process.Pid); err != nil || pgid != cmd.Process.Pid {
		t.Errorf("child's group %d (%v), want its own, %d", pgid, err, cmd.Process.Pid)
	}
	if err := Signal(cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}
}

func TestSignalNoGroup(t *testing.T) {
	for _, pid := range []int{0, -1} {
		if err := Signal(pid, 0); err != syscall.ESRCH {
			t.Errorf("Signal(%d) = %v, want ESRCH without sending", pid, err)
		}
	}
}
