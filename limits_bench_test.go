package knit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// What each limit mechanism costs (docs/process-lanes.md, "Limits and cgroups"): the time
// for a pool of one process lane to come up ready, and a round trip on it, with no limits,
// with rlimits only, and with a cgroup per lane process.
var limitBenchModes = []struct {
	name   string
	limits knit.Limits
}{
	{"none", knit.Limits{Cgroup: knit.CgroupOff}},
	{"rlimits", knit.Limits{OpenFiles: 1024, CPUTime: time.Hour, Cgroup: knit.CgroupOff}},
	{"cgroup", knit.Limits{Memory: 1 << 30, Processes: 1000, OpenFiles: 1024, CPUTime: time.Hour, Cgroup: knit.CgroupRequired}},
}

func limitsBenchPool(b *testing.B, l knit.Limits) *knit.Pool {
	b.Helper()
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(),
		Process: knit.ProcessConfig{Spares: -1, Limits: l}}, benchInt)
	if err != nil && strings.Contains(err.Error(), "cgroups unavailable") {
		b.Skipf("this machine gives no cgroups: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func BenchmarkLimitsStartup(b *testing.B) {
	for _, m := range limitBenchModes {
		b.Run(m.name, func(b *testing.B) {
			for range b.N {
				p := limitsBenchPool(b, m.limits)
				b.StopTimer()
				if err := p.Close(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

func BenchmarkLimitsCall(b *testing.B) {
	for _, m := range limitBenchModes {
		b.Run(m.name, func(b *testing.B) {
			p := limitsBenchPool(b, m.limits)
			b.Cleanup(func() { _ = p.Close(context.Background()) })
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
