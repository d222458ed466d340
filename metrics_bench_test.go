package knit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/knitgo/knit"
)

// Metrics benchmarks (docs/operating.md, "What metrics cost"):
//
//	BenchmarkMetricsCallPath/{goroutine,process}/{before,default,quantiles,sdk}
//	    a sequential Task.Call round trip (int64, 1 lane, no spinning) on a pool with
//	    before:    no monitor at all (knit.NewPoolWithoutMonitor): the call path before metrics
//	    default:   the zero Config: no meter provider (the no-op one), no quantiles
//	    quantiles: LatencyWindow 30s: per-task latency quantiles in Stats
//	    sdk:       the OTel SDK recording every instrument (a manual reader, not collected
//	               while timing), no quantiles
//	BenchmarkMetricsCallPath/{goroutine,process}/alternating
//	    the four pools in one benchmark, 1000 calls on each in turn, so that drift on a
//	    shared machine hits them alike (docs/benchmarks.md §6); reports before-ns/call,
//	    default-ns/call, quantiles-ns/call and sdk-ns/call
func BenchmarkMetricsCallPath(b *testing.B) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		b.Run(rt.String(), func(b *testing.B) {
			for _, v := range metricsVariants {
				b.Run(v, func(b *testing.B) { benchMetricsCall(b, rt, v) })
			}
			b.Run("alternating", func(b *testing.B) { benchMetricsAlternating(b, rt) })
		})
	}
}

var metricsVariants = []string{"before", "default", "quantiles", "sdk"}

// metricsPool starts a 1-lane pool of variant v, warmed up.
func metricsPool(b *testing.B, rt knit.Runtime, v string) (*knit.Pool, func(error) string) {
	b.Helper()
	cfg := knit.Config{Lanes: 1, Runtime: rt}
	if rt == knit.Process {
		cfg.LaneSpin = -1 // as in BenchmarkSupervisionCallPath: no spinning
	}
	newPool := knit.NewPool
	switch v {
	case "before":
		newPool = knit.NewPoolWithoutMonitor
	case "quantiles":
		cfg.LatencyWindow = 30 * time.Second
	case "sdk":
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		cfg.MeterProvider = mp
	}
	p, err := newPool(cfg, benchInt, benchBytes)
	if err != nil {
		b.Fatal(err)
	}
	p, stalled := watched(b, p)
	knit.AwaitSpares(p)
	for n := range inFlight {
		if _, err := benchInt.Call(context.Background(), p, int64(n)); err != nil {
			b.Fatal(stalled(err))
		}
	}
	return p, stalled
}

func benchMetricsCall(b *testing.B, rt knit.Runtime, v string) {
	p, stalled := metricsPool(b, rt, v)
	ctx := context.Background()
	m := startTimer(b)
	for n := range b.N {
		if r, err := benchInt.Call(ctx, p, int64(n)); err != nil || r != int64(n)+1 {
			b.Fatalf("call %d: %v, %s", n, r, stalled(err))
		}
	}
	m.stop(b, false)
}

func benchMetricsAlternating(b *testing.B, rt knit.Runtime) {
	k := len(metricsVariants)
	pools := make([]*knit.Pool, k)
	stalled := make([]func(error) string, k)
	for i, v := range metricsVariants {
		pools[i], stalled[i] = metricsPool(b, rt, v)
	}
	ctx := context.Background()
	spent := make([]time.Duration, k)
	calls := make([]int, k)
	m := startTimer(b)
	for done, which := 0, 0; done < b.N; which = (which + 1) % k {
		n := min(supAltBlock, b.N-done)
		p := pools[which]
		start := time.Now()
		for i := done; i < done+n; i++ {
			if r, err := benchInt.Call(ctx, p, int64(i)); err != nil || r != int64(i)+1 {
				b.Fatalf("call %d: %v, %s", i, r, stalled[which](err))
			}
		}
		spent[which] += time.Since(start)
		calls[which] += n
		done += n
	}
	m.stop(b, false)
	for i, v := range metricsVariants {
		if calls[i] > 0 {
			b.ReportMetric(float64(spent[i].Nanoseconds())/float64(calls[i]), fmt.Sprintf("%s-ns/call", v))
		}
	}
}
