package knit_test

import (
	"context"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// Process-lane benchmarks (docs/benchmarks.md): a sequential round trip with the lane
// spinning (awake) or parked, throughput with 1024 calls in flight, and the time for a pool
// of 4 process lanes to come up ready.

func processBenchPool(b *testing.B, lanes int, spin time.Duration) *knit.Pool {
	b.Helper()
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: lanes, LaneSpin: spin, CallerSpin: spin}, benchInt, benchBytes)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func BenchmarkProcessCall(b *testing.B) {
	for _, mode := range []struct {
		name string
		spin time.Duration
	}{{"awake", 100 * time.Microsecond}, {"parked", -1}} {
		b.Run("int64/"+mode.name, func(b *testing.B) {
			p := processBenchPool(b, 1, mode.spin)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if v, err := benchInt.Call(ctx, p, int64(i)); err != nil || v != int64(i)+1 {
					b.Fatal(v, err)
				}
			}
		})
		b.Run("bytes1KiB/"+mode.name, func(b *testing.B) {
			p := processBenchPool(b, 1, mode.spin)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if v, err := benchBytes.Call(ctx, p, kib); err != nil || len(v) != len(kib) {
					b.Fatal(len(v), err)
				}
			}
		})
	}
}

func BenchmarkProcessThroughput(b *testing.B) {
	for _, lanes := range []int{1, 2} {
		b.Run("int64/lanes="+string(rune('0'+lanes)), func(b *testing.B) {
			p := processBenchPool(b, lanes, 0)
			ctx := context.Background()
			futs := make([]*knit.Future[int64], 0, inFlight)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(inFlight, b.N-done)
				futs = futs[:0]
				for i := range n {
					futs = append(futs, benchInt.Go(ctx, p, int64(i)))
				}
				for i, f := range futs {
					if v, err := f.Wait(); err != nil || v != int64(i)+1 {
						b.Fatal(v, err)
					}
				}
				done += n
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
	}
}

func BenchmarkProcessStartup(b *testing.B) {
	for range b.N {
		p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 4}, benchInt)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := p.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
