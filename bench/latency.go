// The remote latency probe (-remote-latency N): the harness's rows give a mean per call,
// which hid where knit's sequential remote call lost to protoactor's (its slowest calls,
// docs/benchmarks.md, "The node's reaper stays asleep while the agent awaits"). The probe
// times every call of both, in alternating turns, and prints their distributions and the
// CPU the whole machine spent per call.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/knitgo/knit"
)

// latencyTurns is how many turns each side takes; each runs n/latencyTurns calls.
const latencyTurns = 20

// remoteLatency runs n sequential calls each of knit (one remote lane, the default Config)
// and of protoactor's RequestFuture, against the harness's node and echo children, and
// prints per side the mean and percentiles of a call and the machine's CPU per call.
func remoteLatency(n int, stdout io.Writer) error {
	if n < latencyTurns {
		return fmt.Errorf("-remote-latency %d: want at least %d calls", n, latencyTurns)
	}
	echo, err := startNodeChild(childProtoactorEcho, "")
	if err != nil {
		return err
	}
	defer echo.stop()
	sys, r, err := newActorRemote("")
	if err != nil {
		return err
	}
	defer func() { r.Shutdown(true); sys.Shutdown() }()
	node, err := startNodeChild(childKnitNode, "")
	if err != nil {
		return err
	}
	defer node.stop()
	kp, err := newKnitPool(knit.Config{Lanes: 1, Runtime: knit.Remote, Logger: quietLogger(),
		Remote: knit.RemoteConfig{Nodes: []string{node.addr}}})
	if err != nil {
		return err
	}
	defer kp.cleanup()
	pid := actor.NewPID(echo.addr, "echo")
	ctx := context.Background()
	sides := []struct {
		name string
		call func(v uint64) error
		took []time.Duration
		cpu  uint64
	}{
		{name: "protoactor RequestFuture", call: func(v uint64) error {
			_, err := sys.Root.RequestFuture(pid, wrapperspb.UInt64(v), actorTimeout).Result()
			return err
		}},
		{name: "knit Call", call: func(v uint64) error { _, err := knitInc.Call(ctx, kp.Pool, v); return err }},
	}
	per := n / latencyTurns
	for range latencyTurns {
		for i := range sides {
			s := &sides[i]
			time.Sleep(interleaveSettle) // a polling lane parks first, as in -interleave
			c0, err := machineTicks()
			if err != nil {
				return err
			}
			for v := range uint64(per) {
				t0 := time.Now()
				if err := s.call(v); err != nil {
					return fmt.Errorf("%s: %w", s.name, err)
				}
				s.took = append(s.took, time.Since(t0))
			}
			c1, err := machineTicks()
			if err != nil {
				return err
			}
			s.cpu += c1 - c0
		}
	}
	fmt.Fprintf(stdout, "%d calls each, %d turns (machine CPU from /proc/stat, 10 ms ticks)\n", per*latencyTurns, latencyTurns)
	for _, s := range sides {
		q := summarize(s.took)
		cpu := time.Duration(s.cpu) * 10 * time.Millisecond / time.Duration(len(s.took))
		fmt.Fprintf(stdout, "%-26s mean %9v  p50 %9v  p90 %9v  p99 %9v  CPU per call %9v\n", s.name,
			q.mean.Round(100*time.Nanosecond), q.p50.Round(100*time.Nanosecond), q.p90.Round(100*time.Nanosecond),
			q.p99.Round(100*time.Nanosecond), cpu.Round(100*time.Nanosecond))
	}
	return nil
}

type quantiles struct{ mean, p50, p90, p99 time.Duration }

// summarize sorts ds and returns its mean and percentiles (nearest rank below).
func summarize(ds []time.Duration) quantiles {
	if len(ds) == 0 {
		return quantiles{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	at := func(f float64) time.Duration { return ds[int(f*float64(len(ds)-1))] }
	return quantiles{mean: sum / time.Duration(len(ds)), p50: at(0.5), p90: at(0.9), p99: at(0.99)}
}

// machineTicks is the busy time of every CPU, user, nice and system (/proc/stat's first
// line), in clock ticks.
func machineTicks() (uint64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "cpu" {
		return 0, errors.New("/proc/stat: no cpu line")
	}
	var sum uint64
	for _, v := range f[1:4] {
		t, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		sum += t
	}
	return sum, nil
}
