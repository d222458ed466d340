package knit_test

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/knitgo/knit"
)

// Every namespace but steal says something at Debug, on the host and in process lanes (whose
// lines the host re-emits under the same names).
func TestDebugNamespaces(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		t.Run(rt.String(), func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			ready := make(chan knit.Event, 8)
			// Generous timeouts: a loaded machine must not turn the stop into a kill, or a
			// spare's start into a failure, and so change what is logged.
			p, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: rt, PanicCrashesLane: true, Logger: zap.New(core),
				StopAckTimeout: time.Hour, StartupTimeout: time.Hour,
				OnEvent: func(e knit.Event) {
					if e.To == knit.StateReady {
						ready <- e
					}
				}}, procTasks...)
			if err != nil {
				t.Fatal(err)
			}
			<-ready
			call := func() {
				t.Helper()
				if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
					t.Fatalf("call: %d, %v", sum, err)
				}
			}
			call()
			// End the first incarnation on its own, so that a restart follows.
			if rt == knit.Process {
				knit.AwaitSpares(p) // the restart takes the spare
				if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			} else if _, err := boom.Call(context.Background(), p, "crash the lane"); err == nil {
				t.Fatal("a panicking call succeeded")
			}
			if e := <-ready; e.Incarnation != 1 {
				t.Fatalf("ready event %+v, want incarnation 1", e)
			}
			call()
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}

			var seen []string
			for _, e := range logs.All() {
				if e.Level == zapcore.DebugLevel {
					seen = append(seen, e.LoggerName+": "+e.Message)
				}
			}
			want := []string{
				"knit.lifecycle: pool started",
				"knit.codec: task codecs",
				"knit.fastpath: region created",
				"knit.lane: stop requested",
				"knit.lane: stop acknowledged",
				"knit.lane: lane ended",
			}
			if rt == knit.Process {
				want = append(want,
					"knit.lane: lane process started",
					"knit.lane: spare process assigned",
					"knit.lane: lane process reaped",
					// from the lane processes
					"knit.lifecycle: lane ready",
					"knit.fastpath: region mapped",
					"knit.codec: tasks resolved",
					"knit.fastpath: rings fenced",
				)
			} else {
				want = append(want, "knit.lane: lane goroutine started", "knit.fastpath: queue sealed")
			}
			for _, w := range want {
				if !slices.Contains(seen, w) {
					t.Errorf("no Debug entry %q; got %q", w, seen)
				}
			}
		})
	}
}

// Process lanes log Debug entries when the host's logger would take them.
func TestLaneDebugFollowsHostLogger(t *testing.T) {
	info, _ := observer.New(zapcore.InfoLevel)
	debug, _ := observer.New(zapcore.DebugLevel)
	cases := []struct {
		env    string
		logger *zap.Logger
		want   string
	}{
		{"", nil, ""},
		{"lane, codec", nil, "codec,lane"},
		{"*", nil, "*"},
		{"lane", zap.New(info), ""},
		{"", zap.New(debug), "*"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%q/%v", tc.env, tc.logger != nil), func(t *testing.T) {
			t.Setenv("KNIT_DEBUG", tc.env)
			p, err := knit.NewPool(knit.Config{Lanes: 1, Logger: tc.logger}, add)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close(context.Background())
			if got := knit.LaneDebug(p); got != tc.want {
				t.Errorf("lanes get KNIT_DEBUG=%q, want %q", got, tc.want)
			}
		})
	}
}
