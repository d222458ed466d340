package knit_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// TestRemoteStress keeps 1024 calls in flight over 2 remote lanes, first as a window of
// futures from one goroutine, then from 1024 goroutines calling, for KNIT_STRESS each (a
// duration: `KNIT_STRESS=60s go test -run TestRemoteStress`; skipped when unset, being too
// long for CI). Every answer must be right and no forwarder may lose a wake (the link's
// heartbeat counts those it catches: RemoteMissedWakes). Its first version found the
// forward past a full window, whose lost wake held calls for a second
// (docs/benchmarks.md, "A lost wake at a full window").
func TestRemoteStress(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("KNIT_STRESS"))
	if err != nil || d <= 0 {
		t.Skip("KNIT_STRESS (a duration) is not set: a long stress run")
	}
	nodes := startNodes(t, 1)
	p := remotePool(t, knit.Config{Lanes: 2}, nodes)
	ctx := context.Background()
	const w = 1024

	t.Run("window", func(t *testing.T) {
		ring := make([]*knit.Future[int64], w)
		for i := range w {
			ring[i] = add.Go(ctx, p, [2]int64{int64(i), 1})
		}
		n := 0
		for end := time.Now().Add(d); time.Now().Before(end); n++ {
			got, err := ring[n%w].Wait()
			if err != nil || got != int64(n)+1 {
				t.Fatalf("call %d: %d, %v; want %d", n, got, err, n+1)
			}
			ring[n%w] = add.Go(ctx, p, [2]int64{int64(n + w), 1})
		}
		for i := range w {
			if _, err := ring[(n+i)%w].Wait(); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%d calls", n)
	})

	t.Run("goroutines", func(t *testing.T) {
		var n atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for g := range w {
			wg.Go(func() {
				for i := int64(0); time.Now().Before(end); i++ {
					got, err := add.Call(ctx, p, [2]int64{int64(g), i})
					if err != nil || got != int64(g)+i {
						t.Errorf("goroutine %d, call %d: %d, %v", g, i, got, err)
						return
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		t.Logf("%d calls", n.Load())
	})

	if m := knit.RemoteMissedWakes(p); m != 0 {
		t.Errorf("the forwarders lost %d wakes (caught by the heartbeat)", m)
	}
}

// BenchmarkRemoteCallers: n goroutines make blocking Calls, one after another each, b.N in
// all, on a pool of 2 remote lanes on one node. Fewer callers than a lane's window
// (remote.Window) never fill it: the shape in which the forwarder once sent a frame a call (docs/benchmarks.md, "A
// lost wake at a full window"). go test -run '^$' -bench BenchmarkRemoteCallers .
func BenchmarkRemoteCallers(b *testing.B) {
	nodes := startNodes(b, 1)
	p := remotePool(b, knit.Config{Lanes: 2}, nodes)
	ctx := context.Background()
	for _, n := range []int{1, 16, 64, 256, 1024} {
		b.Run(fmt.Sprintf("goroutines=%d", n), func(b *testing.B) {
			var next atomic.Int64
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						if got, err := add.Call(ctx, p, [2]int64{i, 1}); err != nil || got != i+1 {
							b.Errorf("call %d: %d, %v", i, got, err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}
