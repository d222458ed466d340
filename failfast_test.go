package knit_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit"
)

// With FailFast, a call that finds every lane in crash-loop backoff fails at once with
// POOL_UNAVAILABLE; without it, it waits within its context; either way the pool serves
// again once the lanes boot.
func TestFailFastWhileEveryLaneBacksOff(t *testing.T) {
	for _, failFast := range []bool{true, false} {
		bootFail := filepath.Join(t.TempDir(), "bootfail")
		if err := os.WriteFile(bootFail, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("KNIT_TEST_BOOTFAIL", bootFail)
		t.Setenv("KNIT_TEST_BOOTFAIL_ANY", "1")
		rec := newRecorder()
		p, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: knit.Process, Logger: zap.NewNop(), OnEvent: rec.record,
			FailFast: failFast, Process: knit.ProcessConfig{Spares: -1},
			Restart: knit.Restart{MaxRestarts: 1, Period: time.Hour,
				Backoff: knit.Backoff{Min: time.Millisecond, Max: time.Millisecond, CrashLoopMax: time.Millisecond, Jitter: -1}}}, supTasks...)
		if err != nil {
			t.Fatal(err)
		}
		_ = syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL)
		first := rec.await(t, "crash-loop backoff", func(e knit.Event) bool { return e.To == knit.StateCrashLoopBackoff })
		ctx, cancel := context.WithCancel(context.Background())
		if !failFast { // the call waits through more backoffs: only its context ends it
			go func() {
				rec.await(t, "more backoffs", func(e knit.Event) bool {
					return e.To == knit.StateCrashLoopBackoff && e.Incarnation >= first.Incarnation+3
				})
				cancel()
			}()
		}
		_, err = add.Call(ctx, p, [2]int64{1, 2})
		cancel()
		switch {
		case failFast && !errors.Is(err, knit.ErrPoolUnavailable):
			t.Errorf("fail fast: %v, want POOL_UNAVAILABLE", err)
		case !failFast && !errors.Is(err, context.Canceled):
			t.Errorf("waiting call: %v, want its context's end", err)
		}
		if err := os.Remove(bootFail); err != nil {
			t.Fatal(err)
		}
		rec.await(t, "lane back", func(e knit.Event) bool { return e.To == knit.StateReady && e.Incarnation > 0 })
		if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil {
			t.Errorf("call once the lane boots: %v", err)
		}
		_ = p.Close(context.Background())
	}
}
