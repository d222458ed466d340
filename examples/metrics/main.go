// Metrics serves a knit pool's OpenTelemetry metrics to Prometheus: the pool records through
// the OTel SDK, whose Prometheus exporter registers them with a client_golang registry served
// on /metrics. A load generator calls a task on process lanes and, now and then, a task
// that kills its own lane, so that crashes and restarts show too.
//
//	go run ./examples/metrics -addr 127.0.0.1:9464
//	curl -s 127.0.0.1:9464/metrics | grep '^knit_'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/knitgo/knit"
)

var (
	square = knit.Define("metrics.square", func(_ context.Context, n int64) (int64, error) {
		return n * n, nil
	})
	// crash kills the lane process it runs in, as the kernel's OOM killer would: the call
	// fails with WORKER_CRASHED and the supervisor restarts the lane.
	crash = knit.Define("metrics.crash", func(context.Context, int) (int, error) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	})
)

// server is a pool and the handler serving its metrics.
type server struct {
	Pool    *knit.Pool
	Handler http.Handler
	mp      *sdkmetric.MeterProvider
}

// newServer starts a pool of process lanes (cfg's Lanes, OnEvent … are kept) that records
// into a registry of its own, served by Handler.
func newServer(cfg knit.Config) (*server, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	cfg.Runtime, cfg.MeterProvider = knit.Process, mp
	pool, err := knit.NewPool(cfg, square, crash)
	if err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, err
	}
	return &server{Pool: pool, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), mp: mp}, nil
}

// Close closes the pool, then the meter provider.
func (s *server) Close(ctx context.Context) error {
	return errors.Join(s.Pool.Close(ctx), s.mp.Shutdown(ctx))
}

func main() {
	knit.Main() // first: in a lane process it serves tasks

	addr := flag.String("addr", "127.0.0.1:9464", "address to serve /metrics on")
	lanes := flag.Int("lanes", 2, "process lanes")
	crashEvery := flag.Duration("crash-every", 20*time.Second, "how often the load kills a lane (0: never)")
	flag.Parse()

	s, err := newServer(knit.Config{Lanes: *lanes})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.Handler)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	fmt.Printf("metrics at http://%s/metrics (Ctrl-C to stop)\n", ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	load(ctx, s.Pool, *crashEvery)

	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(shutdown)
	if err := s.Close(shutdown); err != nil {
		log.Print(err)
	}
}

// load calls square ten times every 100ms, and crash every crashEvery, until ctx ends.
func load(ctx context.Context, pool *knit.Pool, crashEvery time.Duration) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var crashes <-chan time.Time
	if crashEvery > 0 {
		t := time.NewTicker(crashEvery)
		defer t.Stop()
		crashes = t.C
	}
	for n := int64(0); ; {
		select {
		case <-ctx.Done():
			return
		case <-crashes:
			if _, err := crash.Call(ctx, pool, 0); err != nil && !errors.Is(err, knit.ErrWorkerCrashed) {
				log.Print(err)
			}
		case <-tick.C:
			for range 10 {
				if _, err := square.Call(ctx, pool, n); err != nil && ctx.Err() == nil {
					log.Print(err)
				}
				n++
			}
		}
	}
}
