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

// BenchmarkTicketWidth compares Ticket's batch width (the most calls one claim takes) on
// process lanes, next to private lanes, in the shapes where claims are many: a window of
// 1024 futures and 1024 goroutines calling (docs/benchmarks.md, "A lost wake, the idle
// meter, and Ticket's batch"). The default width is 8.
//
//	TicketWidth/lanes=N/{off,width=W}/{window,goroutines}
func BenchmarkTicketWidth(b *testing.B) {
	for _, lanes := range []int{2, 4, 8} {
		for _, w := range []int{0, 1, 4, 8, 16, 32} {
			mode, name := knit.StealTicket, fmt.Sprintf("width=%d", w)
			if w == 0 {
				mode, name = knit.StealOff, "off"
			}
			cfg := knit.Config{Runtime: knit.Process, Lanes: lanes, Steal: mode}
			if w > 0 {
				cfg = knit.WithTicketWidth(cfg, w)
			}
			run := func(shape string, f func(*testing.B, knit.Config)) {
				b.Run(fmt.Sprintf("lanes=%d/%s/%s", lanes, name, shape), func(b *testing.B) {
					f(b, cfg)
				})
			}
			run("window", benchDefaultWindow)
			run("goroutines", benchDefaultGoroutines)
		}
	}
}
