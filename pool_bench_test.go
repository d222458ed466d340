package knit_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// Pool benchmarks on goroutine lanes, with plain channel pools of the same shapes in the same
// run (docs/benchmarks.md):
//
//	BenchmarkCall/{int64,bytes1KiB}/lanes={1,2}         one Task.Call in flight, no spinning
//	BenchmarkCallSpin/...                               the same with LaneSpin 50µs, CallerSpin 20µs
//	BenchmarkThroughput/{shape}/lanes={1,2}/futures     Task.Go in windows of 1024 from one goroutine
//	BenchmarkThroughput/{shape}/lanes={1,2}/goroutines  ~1024 goroutines calling Task.Call
//	BenchmarkThroughputSpin/...                         the same with spinning
//	BenchmarkChannelPool/{shape}/...                    unbuffered round trip to one worker; a
//	                                                    buffered pool of 2 workers, 1024 in flight
//	BenchmarkIdleCPU/{nospin,spin}                      CPU burnt per call when calls are 1ms apart
//
// Every benchmark also reports cpu-ns/op: the process's user+system CPU time (all threads)
// divided by the number of calls, so cpu-ns/op ÷ ns/op is the number of cores kept busy.
// A watchdog (benchPool) turns a pool that stops completing calls into a failed benchmark
// instead of a hung run; docs/benchmarks.md records the stalls it caught.
//
// BenchmarkDefault, at the end, measures the default Config on goroutine and process lanes,
// without channel pools, watchdog or cpu-ns/op.

// inFlight is the number of calls outstanding in the throughput benchmarks.
const inFlight = 1024

// Spin budgets of the *Spin benchmarks.
const (
	benchLaneSpin   = 50 * time.Microsecond
	benchCallerSpin = 20 * time.Microsecond
)

var kib = make([]byte, 1024)

// workload is one payload shape: its task, the input of call n and a check of the result.
type workload[In, Out any] struct {
	task  *knit.Task[In, Out]
	input func(n int) In
	ok    func(in In, out Out) bool
}

var (
	intLoad = workload[int64, int64]{
		task:  benchInt,
		input: func(n int) int64 { return int64(n) },
		ok:    func(in, out int64) bool { return out == in+1 },
	}
	bytesLoad = workload[[]byte, []byte]{
		task:  benchBytes,
		input: func(int) []byte { return kib },
		ok:    func(in, out []byte) bool { return len(out) == len(in) && &out[0] == &in[0] },
	}
)

// cpuMeter reports cpu-ns/op from the process's rusage.
type cpuMeter struct{ start time.Duration }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startTimer resets the benchmark timer and starts measuring CPU time.
func startTimer(b *testing.B) *cpuMeter {
	b.ReportAllocs()
	m := &cpuMeter{start: cpuTime()}
	b.ResetTimer()
	return m
}

// stop stops the benchmark timer and reports cpu-ns/op and, if throughput, calls/s.
func (m *cpuMeter) stop(b *testing.B, throughput bool) {
	b.StopTimer()
	cpu := cpuTime() - m.start
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	if throughput {
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	}
}

// benchPool starts a pool of the bench tasks with a stall watchdog: when calls are in
// flight and no lane completes any for stallAfter, the watchdog records what the lanes hold
// and closes the pool, so the stuck calls fail (and the benchmark with them) instead of
// hanging the run. Benchmarks report a failure with stalled(err).
func benchPool(b *testing.B, cfg knit.Config) (*knit.Pool, func(error) string) {
	b.Helper()
	p, err := knit.NewPool(cfg, benchInt, benchBytes)
	if err != nil {
		b.Fatal(err)
	}
	return watched(b, p)
}

// watched puts a started pool under the stall watchdog and closes it at the end.
func watched(b *testing.B, p *knit.Pool) (*knit.Pool, func(error) string) {
	var why atomic.Pointer[string]
	done, exited := make(chan struct{}), make(chan struct{})
	go watchdog(p, &why, done, exited)
	b.Cleanup(func() {
		if err := p.Close(context.Background()); err != nil && why.Load() == nil {
			b.Error(err)
		}
	})
	b.Cleanup(func() { close(done); <-exited })
	return p, func(err error) string {
		if w := why.Load(); w != nil {
			return fmt.Sprintf("%v; %s", err, *w)
		}
		return fmt.Sprint(err)
	}
}

const stallAfter = 3 * time.Second

func watchdog(p *knit.Pool, why *atomic.Pointer[string], done <-chan struct{}, exited chan<- struct{}) {
	defer close(exited)
	tick := time.NewTicker(stallAfter / 3)
	defer tick.Stop()
	var last uint64
	quiet := 0
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		st := p.Stats()
		var completed uint64
		inflight := 0
		for _, l := range st.Lanes {
			completed += l.Completed + l.Failed
			inflight += l.InFlight
		}
		if completed != last || inflight == 0 {
			last, quiet = completed, 0
			continue
		}
		if quiet++; quiet < 3 {
			continue
		}
		msg := fmt.Sprintf("STALL: no call completed for %v with calls in flight; lanes: %+v", stallAfter, st.Lanes)
		why.Store(&msg)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = p.Close(ctx) // settles the stuck calls with ErrThreadClosed
		cancel()
		<-done
		return
	}
}

func noSpin(lanes int) knit.Config { return knit.Config{Lanes: lanes} }

func withSpin(lanes int) knit.Config {
	return knit.Config{Lanes: lanes, LaneSpin: benchLaneSpin, CallerSpin: benchCallerSpin}
}

// forShapes runs body for int64 and 1 KiB []byte payloads.
func forShapes(b *testing.B, ints, bytes func(*testing.B)) {
	b.Run("int64", ints)
	b.Run("bytes1KiB", bytes)
}

// forLanes runs body with 1 and 2 lanes.
func forLanes(b *testing.B, body func(b *testing.B, lanes int)) {
	for _, lanes := range []int{1, 2} {
		b.Run(fmt.Sprintf("lanes=%d", lanes), func(b *testing.B) { body(b, lanes) })
	}
}

func BenchmarkCall(b *testing.B) {
	forShapes(b,
		func(b *testing.B) { forLanes(b, func(b *testing.B, n int) { benchCall(b, intLoad, noSpin(n)) }) },
		func(b *testing.B) { forLanes(b, func(b *testing.B, n int) { benchCall(b, bytesLoad, noSpin(n)) }) })
}

func BenchmarkCallSpin(b *testing.B) {
	forShapes(b,
		func(b *testing.B) { forLanes(b, func(b *testing.B, n int) { benchCall(b, intLoad, withSpin(n)) }) },
		func(b *testing.B) { forLanes(b, func(b *testing.B, n int) { benchCall(b, bytesLoad, withSpin(n)) }) })
}

// benchCall: a sequential round trip, one call in flight.
func benchCall[In, Out any](b *testing.B, w workload[In, Out], cfg knit.Config) {
	p, stalled := benchPool(b, cfg)
	ctx := context.Background()
	for n := range inFlight { // warm up: records, lanes, scheduler
		if _, err := w.task.Call(ctx, p, w.input(n)); err != nil {
			b.Fatal(stalled(err))
		}
	}
	m := startTimer(b)
	for n := range b.N {
		in := w.input(n)
		out, err := w.task.Call(ctx, p, in)
		if err != nil || !w.ok(in, out) {
			b.Fatalf("call %d: %v, %s", n, out, stalled(err))
		}
	}
	m.stop(b, false)
}

func BenchmarkThroughput(b *testing.B) {
	forShapes(b,
		func(b *testing.B) { forLanes(b, func(b *testing.B, n int) { benchThroughput(b, intLoad, noSpin(n)) }) },
		func(b *testing.B) {
			forLanes(b, func(b *testing.B, n int) { benchThroughput(b, bytesLoad, noSpin(n)) })
		})
}

func BenchmarkThroughputSpin(b *testing.B) {
	forShapes(b,
		func(b *testing.B) {
			forLanes(b, func(b *testing.B, n int) { benchThroughput(b, intLoad, withSpin(n)) })
		},
		func(b *testing.B) {
			forLanes(b, func(b *testing.B, n int) { benchThroughput(b, bytesLoad, withSpin(n)) })
		})
}

func benchThroughput[In, Out any](b *testing.B, w workload[In, Out], cfg knit.Config) {
	b.Run("futures", func(b *testing.B) { benchFutures(b, w, cfg) })
	b.Run("goroutines", func(b *testing.B) { benchGoroutines(b, w, cfg) })
}

// warmUp makes inFlight sequential calls on a new pool before the throughput benchmarks
// put calls in flight.
func warmUp[In, Out any](b *testing.B, w workload[In, Out], p *knit.Pool, stalled func(error) string) {
	ctx := context.Background()
	for n := range inFlight {
		if _, err := w.task.Call(ctx, p, w.input(n)); err != nil {
			b.Fatal(stalled(err))
		}
	}
}

// benchFutures: one goroutine starts inFlight calls with Task.Go, waits for all of them,
// and repeats.
func benchFutures[In, Out any](b *testing.B, w workload[In, Out], cfg knit.Config) {
	p, stalled := benchPool(b, cfg)
	ctx := context.Background()
	futs := make([]*knit.Future[Out], inFlight)
	ins := make([]In, inFlight)
	window := func(first, k int) {
		for i := range k {
			ins[i] = w.input(first + i)
			futs[i] = w.task.Go(ctx, p, ins[i])
		}
		for i := range k {
			out, err := futs[i].Wait()
			if err != nil || !w.ok(ins[i], out) {
				b.Fatalf("call %d: %v, %s", first+i, out, stalled(err))
			}
			futs[i] = nil
		}
	}
	warmUp(b, w, p, stalled)
	window(0, inFlight)
	m := startTimer(b)
	for done := 0; done < b.N; done += inFlight {
		window(done, min(inFlight, b.N-done))
	}
	m.stop(b, true)
}

// benchGoroutines: b.RunParallel with ⌈inFlight/GOMAXPROCS⌉×GOMAXPROCS goroutines, each
// making one blocking Task.Call after another.
func benchGoroutines[In, Out any](b *testing.B, w workload[In, Out], cfg knit.Config) {
	p, stalled := benchPool(b, cfg)
	ctx := context.Background()
	warmUp(b, w, p, stalled)
	var failed atomic.Bool // report the first failure only
	var wg sync.WaitGroup
	for n := range inFlight { // as many records as calls in flight
		wg.Go(func() {
			if _, err := w.task.Call(ctx, p, w.input(n)); err != nil && !failed.Swap(true) {
				b.Error(stalled(err))
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		return
	}
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((inFlight + procs - 1) / procs)
	m := startTimer(b)
	b.RunParallel(func(pb *testing.PB) {
		for n := 0; pb.Next(); n++ {
			in := w.input(n)
			out, err := w.task.Call(ctx, p, in)
			if err != nil || !w.ok(in, out) {
				if !failed.Swap(true) {
					b.Errorf("call: %v, %s", out, stalled(err))
				}
				return
			}
		}
	})
	m.stop(b, true)
}

// BenchmarkChannelPool: plain channel hand-offs with the same shapes, for comparison.
func BenchmarkChannelPool(b *testing.B) {
	forShapes(b,
		func(b *testing.B) { benchChannels(b, intLoad.input, intLoad.ok, func(v int64) int64 { return v + 1 }) },
		func(b *testing.B) {
			benchChannels(b, bytesLoad.input, bytesLoad.ok, func(v []byte) []byte { return v })
		})
}

func benchChannels[T any](b *testing.B, input func(int) T, ok func(in, out T) bool, fn func(T) T) {
	b.Run("unbuffered", func(b *testing.B) { benchChanRoundTrip(b, input, ok, fn) })
	b.Run("workers=2/window", func(b *testing.B) { benchChanWindow(b, input, ok, fn) })
	b.Run("workers=2/goroutines", func(b *testing.B) { benchChanGoroutines(b, input, ok, fn) })
}

// benchChanRoundTrip: one worker goroutine; request and reply on two unbuffered channels.
func benchChanRoundTrip[T any](b *testing.B, input func(int) T, ok func(in, out T) bool, fn func(T) T) {
	req, resp := make(chan T), make(chan T)
	go func() {
		for v := range req {
			resp <- fn(v)
		}
		close(resp)
	}()
	defer func() { close(req); <-resp }()
	for n := range inFlight {
		req <- input(n)
		<-resp
	}
	m := startTimer(b)
	for n := range b.N {
		in := input(n)
		req <- in
		if out := <-resp; !ok(in, out) {
			b.Fatalf("call %d: %v", n, out)
		}
	}
	m.stop(b, false)
}

type chanJob[T any] struct {
	v     T
	reply chan chanReply[T]
}

type chanReply[T any] struct{ in, out T }

// startChanPool starts 2 workers reading jobs from one channel buffered to inFlight.
func startChanPool[T any](fn func(T) T) (jobs chan chanJob[T], stop func()) {
	jobs = make(chan chanJob[T], inFlight)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for j := range jobs {
				j.reply <- chanReply[T]{in: j.v, out: fn(j.v)}
			}
		})
	}
	return jobs, func() { close(jobs); wg.Wait() }
}

// benchChanWindow: one goroutine sends inFlight jobs whose replies come back on one channel
// buffered to inFlight, receives them all, and repeats (the analogue of Task.Go windows).
func benchChanWindow[T any](b *testing.B, input func(int) T, ok func(in, out T) bool, fn func(T) T) {
	jobs, stop := startChanPool(fn)
	defer stop()
	replies := make(chan chanReply[T], inFlight)
	window := func(first, k int) {
		for i := range k {
			jobs <- chanJob[T]{v: input(first + i), reply: replies}
		}
		for range k {
			if r := <-replies; !ok(r.in, r.out) {
				b.Fatalf("window at %d: reply %v for %v", first, r.out, r.in)
			}
		}
	}
	window(0, inFlight)
	m := startTimer(b)
	for done := 0; done < b.N; done += inFlight {
		window(done, min(inFlight, b.N-done))
	}
	m.stop(b, true)
}

// benchChanGoroutines: ~inFlight goroutines, each with its own reply channel, send jobs to
// the 2 workers one after another.
func benchChanGoroutines[T any](b *testing.B, input func(int) T, ok func(in, out T) bool, fn func(T) T) {
	jobs, stop := startChanPool(fn)
	defer stop()
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((inFlight + procs - 1) / procs)
	m := startTimer(b)
	b.RunParallel(func(pb *testing.PB) {
		reply := make(chan chanReply[T], 1)
		for n := 0; pb.Next(); n++ {
			in := input(n)
			jobs <- chanJob[T]{v: in, reply: reply}
			if r := <-reply; !ok(in, r.out) {
				b.Errorf("reply %v for %v", r.out, in)
				return
			}
		}
	})
	m.stop(b, true)
}

// BenchmarkIdleCPU: one call every millisecond (the caller sleeps in between), so a lane
// that spins burns its budget after every call. cpu-ns/op is the CPU time the whole process
// spent per call, the sleep's own timer wake-up included; ns/op is dominated by the sleep.
func BenchmarkIdleCPU(b *testing.B) {
	for _, c := range []struct {
		name string
		cfg  knit.Config
	}{{"nospin", noSpin(1)}, {"spin", withSpin(1)}} {
		b.Run(c.name, func(b *testing.B) {
			p, stalled := benchPool(b, c.cfg)
			ctx := context.Background()
			if _, err := benchInt.Call(ctx, p, 0); err != nil {
				b.Fatal(stalled(err))
			}
			m := startTimer(b)
			for n := range b.N {
				time.Sleep(time.Millisecond)
				if _, err := benchInt.Call(ctx, p, int64(n)); err != nil {
					b.Fatal(stalled(err))
				}
			}
			m.stop(b, false)
		})
	}
}

// BenchmarkDefault measures the shapes of the speed issue with the default Config (only Lanes
// and Runtime set), so that the figures are what users get:
//
//	Default/{goroutine,process}/call/lanes=N        one Task.Call in flight
//	Default/{goroutine,process}/window/lanes=N      one goroutine keeps 1024 futures in flight:
//	                                                wait for the oldest, start one more
//	Default/{goroutine,process}/goroutines/lanes=N  1024 goroutines each calling Task.Call
//	Default/{goroutine,process}/map/lanes=N         one Task.Map over b.N inputs
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
			b.Run(name("map"), func(b *testing.B) { benchDefaultMap(b, cfg) })
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

func benchDefaultWindow(b *testing.B, cfg knit.Config) { benchWindow(b, cfg, inFlight) }

// benchWindow: one goroutine keeps w futures in flight.
func benchWindow(b *testing.B, cfg knit.Config, w int) {
	p := defaultPool(b, cfg)
	ctx := context.Background()
	ring := make([]*knit.Future[int64], w)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N + w {
		k := i % w
		if f := ring[k]; f != nil {
			if v, err := f.Wait(); err != nil || v != int64(i-w)+1 {
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

// BenchmarkProcessWindows is windows of futures on process lanes (default Config) in the
// shapes that became slower with issue 28's spin policy: small windows, and more lanes than
// cores (docs/benchmarks.md, "Small windows and many process lanes").
func BenchmarkProcessWindows(b *testing.B) {
	for _, s := range []struct{ lanes, window int }{{2, 8}, {2, 64}, {1, 1024}, {4, 1024}, {8, 1024}} {
		b.Run(fmt.Sprintf("lanes=%d/window=%d", s.lanes, s.window), func(b *testing.B) {
			benchWindow(b, knit.Config{Runtime: knit.Process, Lanes: s.lanes}, s.window)
		})
	}
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

func benchDefaultMap(b *testing.B, cfg knit.Config) {
	p := defaultPool(b, cfg)
	in := make([]int64, b.N)
	for i := range in {
		in[i] = int64(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	out, err := benchInt.Map(context.Background(), p, in)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	for i, v := range out {
		if v != int64(i)+1 {
			b.Fatalf("out[%d] = %d", i, v)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

// BenchmarkParked measures one process lane whose lane and callers never spin (LaneSpin and
// CallerSpin negative: a tuned Config, not the default), so every call pays the wake-ups:
//
//	Parked/call  Task.Call: the caller sleeps on the return ring's direct futex
//	Parked/go    Task.Go then Future.Wait: the pool's reaper sleeps on the lane's eventfd,
//	             through Go's netpoller, and hands the result on
//
// The difference is what a parked pool pays per wake when its callers do not wait alone.
func BenchmarkParked(b *testing.B) {
	cfg := knit.Config{Runtime: knit.Process, Lanes: 1, LaneSpin: -1, CallerSpin: -1}
	b.Run("call", func(b *testing.B) { benchDefaultCall(b, cfg) })
	b.Run("go", func(b *testing.B) {
		p := defaultPool(b, cfg)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if v, err := benchInt.Go(ctx, p, int64(i)).Wait(); err != nil || v != int64(i)+1 {
				b.Fatal(v, err)
			}
		}
	})
}
