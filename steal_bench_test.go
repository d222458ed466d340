package knit_test

import (
	"fmt"
	"testing"

	"github.com/knitgo/knit"
)

// BenchmarkSteal measures what work stealing costs on uniform calls: the shapes of
// BenchmarkDefault with private lanes (StealOff, the LeastLoaded balancer) and with each
// discipline, in one run (docs/benchmarks.md). The skewed workloads, where stealing pays,
// are in the bench/ harness.
//
//	Steal/{goroutine,process}/lanes=N/{off,ticket,dekker}/{call,window,goroutines}
func BenchmarkSteal(b *testing.B) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		for _, lanes := range []int{2, 4} {
			modes := []knit.Steal{knit.StealOff, knit.StealTicket, knit.StealDekker}
			if rt == knit.Goroutine {
				modes = append(modes, knit.StealLocal)
			}
			for _, mode := range modes {
				cfg := knit.Config{Runtime: rt, Lanes: lanes, Steal: mode}
				name := func(shape string) string { return fmt.Sprintf("%s/lanes=%d/%s/%s", rt, lanes, mode, shape) }
				b.Run(name("call"), func(b *testing.B) { benchDefaultCall(b, cfg) })
				b.Run(name("window"), func(b *testing.B) { benchDefaultWindow(b, cfg) })
				b.Run(name("goroutines"), func(b *testing.B) { benchDefaultGoroutines(b, cfg) })
			}
		}
	}
}
