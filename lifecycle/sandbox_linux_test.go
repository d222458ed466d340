//go:build linux

package lifecycle

import (
	"errors"
	"fmt"
	"os"
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

// Without Landlock ABI 2 the seccomp preset lacks its process scope: a required preset fails
// saying so, a best-effort one is logged as downgraded.
func TestSeccompScopeOnOldKernels(t *testing.T) {
	if err := seccompUsable(); err != nil {
		t.Skipf("no seccomp preset here: %v", err)
	}
	for _, abi := range []int{0, 1} {
		if _, err := applyScope(abi, SandboxRequired, nil); !errors.Is(err, errSandboxUnsupported) ||
			!strings.Contains(err.Error(), "/proc/<pid>/mem") {
			t.Errorf("required on ABI %d: %v", abi, err)
		}
		if ok, err := applyScope(abi, SandboxBestEffort, nil); ok || err != nil {
			t.Errorf("best effort on ABI %d: %v, %v", abi, ok, err)
		}
		got := strings.Join(sandboxDowngrades(Sandbox{Seccomp: Seccomp{Mode: SandboxBestEffort}}, abi), "; ")
		if !strings.Contains(got, "writes beneath /proc and /sys") {
			t.Errorf("best effort on ABI %d logs %q", abi, got)
		}
	}
	if got := sandboxDowngrades(Sandbox{Seccomp: Seccomp{Mode: SandboxBestEffort}}, 2); len(got) != 0 {
		t.Errorf("ABI 2: %q", got)
	}
}

// The scope allows writing beneath every entry of / but proc and sys: a directory with every
// write right, anything else with writing only; a dangling link names nothing to allow.
func TestScopeRules(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"proc", "sys", "usr", "tmp"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("missing", filepath.Join(root, "dangling")); err != nil {
		t.Fatal(err)
	}
	rules, err := scopeRules(root)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]string{}
	for _, r := range rules {
		text := fmt.Sprint(r) // "REQUIRE {rights} for paths [path]"
		i := strings.LastIndex(text, "[")
		byPath[strings.Trim(text[i:], "[]")] = text
	}
	for name, rights := range map[string][]string{
		"usr": {"write_file", "make_dir", "remove_file", "refer"}, "tmp": {"make_reg", "make_sym"},
		"lib": {"make_dir"}, "file": {"write_file"},
	} {
		text, ok := byPath[filepath.Join(root, name)]
		if !ok {
			t.Errorf("no rule for %s: %v", name, byPath)
			continue
		}
		for _, r := range rights {
			if !strings.Contains(text, r) {
				t.Errorf("%s: %s, want %s", name, text, r)
			}
		}
	}
	if text := byPath[filepath.Join(root, "file")]; strings.Contains(text, "make_") || strings.Contains(text, "refer") {
		t.Errorf("a file allowed directory rights: %s", text)
	}
	if len(rules) != 4 { // not proc, sys, dangling
		t.Errorf("%d rules, want 4: %v", len(rules), byPath)
	}
}
