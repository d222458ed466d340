//go:build linux

package lifecycle

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// What a kernel with too old a Landlock does to each mode. These never reach a kernel
// call that restricts (the test process stays unconfined): a required policy fails before,
// a best-effort one on ABI 0 has nothing to restrict with.
func TestLandlockOnOldKernels(t *testing.T) {
	l := Landlock{Mode: SandboxRequired, ReadOnly: []string{t.TempDir()}}
	for _, tc := range []struct {
		abi  int
		net  bool
		want string
	}{
		{0, false, "Landlock is not enabled in this kernel"},
		{0, true, "Landlock is not enabled in this kernel"},
		{3, false, "kernel Landlock ABI 3, the policy needs 4 (denying TCP bind and connect (ABI 4)"},
		{2, true, "kernel Landlock ABI 2, the policy needs 3 (truncating files (ABI 3)"},
	} {
		l.AllowNetwork = tc.net
		_, err := applyLandlock(l, tc.abi)
		if !errors.Is(err, errSandboxUnsupported) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("required on ABI %d (network allowed: %v): %v, want %q", tc.abi, tc.net, err, tc.want)
		}
	}
	l.Mode = SandboxBestEffort
	if abi, err := applyLandlock(l, 0); err != nil || abi != 0 {
		t.Errorf("best effort on ABI 0: %d, %v", abi, err)
	}
	l.ReadOnly = []string{filepath.Join(t.TempDir(), "missing")}
	if _, err := applyLandlock(l, 0); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing path in best effort: %v, want an error naming it", err)
	}
}

func TestSandboxDowngrades(t *testing.T) {
	s := Sandbox{Landlock: Landlock{Mode: SandboxBestEffort}}
	for abi, want := range map[int]string{
		0: "Landlock ABI 0 does not enforce everything: Landlock is not enabled in this kernel",
		4: "Landlock ABI 4 does not enforce ioctl on devices (ABI 5), signals and abstract unix sockets outside the lane (ABI 6)",
		6: "",
		7: "",
	} {
		got := strings.Join(sandboxDowngrades(s, abi), "; ")
		if got != want {
			t.Errorf("ABI %d: %q, want %q", abi, got, want)
		}
	}
	s.Landlock.Mode = SandboxRequired // a required layer fails instead: nothing to log
	if got := sandboxDowngrades(s, 0); len(got) != 0 {
		t.Errorf("required: %q", got)
	}
}

func TestSandboxCheck(t *testing.T) {
	for _, s := range []Sandbox{
		{Landlock: Landlock{Mode: 7}},
		{Seccomp: Seccomp{Mode: -1}},
		{Landlock: Landlock{Mode: SandboxRequired, Writable: []string{"tmp"}}},
		{Landlock: Landlock{Mode: SandboxRequired, ReadOnly: []string{""}}},
	} {
		if s.Check() == nil {
			t.Errorf("%+v passed Check", s)
		}
		if err := applySandbox(&s, zap.NewNop()); err == nil {
			t.Errorf("%+v applied", s)
		}
	}
	if err := applySandbox(nil, zap.NewNop()); err != nil {
		t.Errorf("no sandbox: %v", err)
	}
}
