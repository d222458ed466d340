package knit_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/knitgo/knit"
)

// BenchmarkDefault measures the shapes of the speed issue with the default Config (only Lanes
// and Runtime set), so that the figures are what users get:
//
//	Default/{goroutine,process}/call/lanes=N        one Task.Call in flight
//	Default/{goroutine,process}/window/lanes=N      one goroutine keeps 1024 futures in flight:
//	                                                wait for the oldest, start one more
//	Default/{goroutine,process}/goroutines/lanes=N  1024 goroutines each calling Task.Call
//
// The peer comparison (channels, unix sockets) lives in bench/.
func BenchmarkDefault(b *testing.B) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		for _, lanes := range []int{1, 2, 4} {
			cfg := knit.Config{Runtime: rt, Lanes: lanes}
			name := func(shape string) string { return fmt.Sprintf("%s/%s/lanes=%d", rt, shape, lanes) }
			b.Run(name("call"), func(b *testing.B) { benchDefaultCall(b, cfg) })
			b.Run(name("window"), func(b *testing.B) { benchDefaultWindow(b, cfg) })
			b.Run(name("goroutines"), func(b *testing.B) { benchDefaultGoroutines(b, cfg) })
		}
	}
}

func defaultPool(b *testing.B, cfg knit.Config) *knit.Pool {
	b.Helper()
	p, err := knit.NewPool(cfg, benchInt)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close(context.Background()) })
	ctx := context.Background()
	for i := range inFlight { // warm up: records, rings, spare
		if _, err := benchInt.Call(ctx, p, int64(i)); err != nil {
			b.Fatal(err)
		}
	}
	return p
}

func benchDefaultCall(b *testing.B, cfg knit.Config) {
	p := defaultPool(b, cfg)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if v, err := benchInt.Call(ctx, p, int64(i)); err != nil || v != int64(i)+1 {
			b.Fatal(v, err)
		}
	}
}

func benchDefaultWindow(b *testing.B, cfg knit.Config) {
	p := defaultPool(b, cfg)
	ctx := context.Background()
	var ring [inFlight]*knit.Future[int64]
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N + inFlight {
		k := i % inFlight
		if f := ring[k]; f != nil {
			if v, err := f.Wait(); err != nil || v != int64(i-inFlight)+1 {
				b.Fatal(i, v, err)
			}
			ring[k] = nil
		}
		if i < b.N {
			ring[k] = benchInt.Go(ctx, p, int64(i))
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

func benchDefaultGoroutines(b *testing.B, cfg knit.Config) {
	p := defaultPool(b, cfg)
	ctx := context.Background()
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((inFlight + procs - 1) / procs)
	var once sync.Once
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for n := int64(0); pb.Next(); n++ {
			if v, err := benchInt.Call(ctx, p, n); err != nil || v != n+1 {
				once.Do(func() { b.Error(v, err) })
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}
