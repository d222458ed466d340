//go:build linux

// Command loadprobe measures one knit pool shape beside busy loops, for the
// scheduler traces of docs/benchmarks.md (issue 28): the latency
// distribution of sequential calls, or the throughput of a window of 1024
// futures or of a Map, with -hogs busy loops (sh -c 'while :; do :; done')
// at niceness -nice running beside it. With PIDFILE set it writes the lane
// processes' PIDs there once the pool is warm, for perf to tell the lanes
// from the host:
//
//	go build -o /tmp/loadprobe ./cmd/loadprobe
//	PIDFILE=/tmp/lanes /tmp/loadprobe -mode call -n 40000 -hogs 2 &
//	sleep 2; perf sched record -o sched.data -- sleep 1
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
)

var inc = knit.Define("loadprobe.inc", func(_ context.Context, x int64) (int64, error) { return x + 1, nil })

func main() {
	knit.Main()
	spin := flag.Duration("spin", 0, "LaneSpin and CallerSpin (0: the default; negative: none)")
	hogs := flag.Int("hogs", 0, "busy loops to start beside the pool")
	nice := flag.Int("nice", 0, "the busy loops' niceness")
	n := flag.Int("n", 20000, "calls (or Map elements)")
	rt := flag.String("rt", "process", "runtime: process or goroutine")
	mode := flag.String("mode", "call", "call (sequential Call), window (1024 futures) or map")
	lanes := flag.Int("lanes", 1, "lanes")
	flag.Parse()
	if err := run(*spin, *hogs, *nice, *n, *rt, *mode, *lanes); err != nil {
		fmt.Fprintln(os.Stderr, "loadprobe:", err)
		os.Exit(1)
	}
}

func run(spin time.Duration, hogs, nice, n int, rt, mode string, lanes int) error {
	for range hogs {
		c := exec.Command("sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			return err
		}
		defer func() { _ = c.Process.Kill(); _ = c.Wait() }()
		if nice != 0 {
			if err := unix.Setpriority(unix.PRIO_PROCESS, c.Process.Pid, nice); err != nil {
				return err
			}
		}
	}
	if hogs > 0 {
		time.Sleep(200 * time.Millisecond)
	}
	r := knit.Goroutine
	if rt == "process" {
		r = knit.Process
	}
	p, err := knit.NewPool(knit.Config{Runtime: r, Lanes: lanes, LaneSpin: spin, CallerSpin: spin}, inc)
	if err != nil {
		return err
	}
	defer func() { _ = p.Close(context.Background()) }()
	ctx := context.Background()
	for i := range 1000 {
		if _, err := inc.Call(ctx, p, int64(i)); err != nil {
			return err
		}
	}
	if f := os.Getenv("PIDFILE"); f != "" {
		s := ""
		for _, l := range p.Stats().Lanes {
			s += strconv.Itoa(l.PID) + " "
		}
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			return err
		}
	}
	label := fmt.Sprintf("%s %s spin=%v hogs=%d nice=%d lanes=%d", rt, mode, spin, hogs, nice, lanes)
	switch mode {
	case "call":
		lat := make([]time.Duration, n)
		start := time.Now()
		for i := range n {
			t := time.Now()
			if _, err := inc.Call(ctx, p, int64(i)); err != nil {
				return err
			}
			lat[i] = time.Since(t)
		}
		total := time.Since(start)
		slices.Sort(lat)
		fmt.Printf("%s: mean %v p50 %v p90 %v p99 %v max %v\n", label, total/time.Duration(n),
			lat[n/2], lat[n*9/10], lat[n*99/100], lat[n-1])
	case "window":
		const w = 1024
		ring := make([]*knit.Future[int64], w)
		start := time.Now()
		for i := range n {
			if f := ring[i%w]; f != nil {
				if _, err := f.Wait(); err != nil {
					return err
				}
			}
			ring[i%w] = inc.Go(ctx, p, int64(i))
		}
		for _, f := range ring {
			if f != nil {
				if _, err := f.Wait(); err != nil {
					return err
				}
			}
		}
		el := time.Since(start)
		fmt.Printf("%s: %v/call %.3f M/s\n", label, el/time.Duration(n), float64(n)/el.Seconds()/1e6)
	case "map":
		in := make([]int64, n)
		start := time.Now()
		if _, err := inc.Map(ctx, p, in); err != nil {
			return err
		}
		el := time.Since(start)
		fmt.Printf("%s: %v/call %.3f M/s\n", label, el/time.Duration(n), float64(n)/el.Seconds()/1e6)
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	return nil
}
