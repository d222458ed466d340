package knit_test

import (
	"context"
	"testing"

	"github.com/knitgo/knit"
)

// BenchmarkSandbox measures what each containment mechanism costs a process lane: start/…
// is NewPool with one lane (spawn, boot, sandbox, ready) and Close; call/… is a sequential
// int64 round trip on a lane so confined. docs/process-lanes.md, "Containing untrusted or
// crashy code", takes its cost column from one run of
//
//	go test -run '^$' -bench 'BenchmarkSandbox' -benchtime 200x .
func BenchmarkSandbox(b *testing.B) {
	for _, m := range []struct {
		name string
		cfg  func(b *testing.B) knit.ProcessConfig
	}{
		{"none", func(*testing.B) knit.ProcessConfig { return knit.ProcessConfig{} }},
		// rlimits and cgroups: BenchmarkLimitsStartup and BenchmarkLimitsCall.
		{"landlock", func(b *testing.B) knit.ProcessConfig {
			return knit.ProcessConfig{Sandbox: benchLandlock(b)}
		}},
		{"seccomp", func(*testing.B) knit.ProcessConfig {
			return knit.ProcessConfig{Sandbox: knit.Sandbox{Seccomp: knit.Seccomp{Mode: knit.SandboxRequired}}}
		}},
		{"landlock+seccomp", func(b *testing.B) knit.ProcessConfig {
			s := benchLandlock(b)
			s.Seccomp.Mode = knit.SandboxRequired
			return knit.ProcessConfig{Sandbox: s}
		}},
		{"bwrap", func(b *testing.B) knit.ProcessConfig {
			return knit.ProcessConfig{Prefix: bwrapPrefix(b)}
		}},
	} {
		b.Run("start/"+m.name, func(b *testing.B) {
			pc := m.cfg(b)
			pc.Spares = -1 // no spare starting in the background of the next round
			for range b.N {
				p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Process: pc}, benchInt)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := p.Close(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
		b.Run("call/"+m.name, func(b *testing.B) {
			pc := m.cfg(b)
			p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Process: pc}, benchInt)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			ctx := context.Background()
			b.ResetTimer()
			for i := range b.N {
				if v, err := benchInt.Call(ctx, p, int64(i)); err != nil || v != int64(i)+1 {
					b.Fatal(v, err)
				}
			}
		})
	}
}

// benchLandlock is a typical policy: the system read-only, a scratch directory writable.
func benchLandlock(b *testing.B) knit.Sandbox {
	if abi := landlockABI(); abi < 4 {
		b.Skipf("Landlock ABI %d: the policy needs 4", abi)
	}
	return knit.Sandbox{Landlock: knit.Landlock{Mode: knit.SandboxRequired,
		ReadOnly: []string{"/usr", "/etc"}, Writable: []string{b.TempDir()}}}
}
