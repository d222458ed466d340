package knit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// Define and its options (task.go).

func TestTaskTimeout(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1})
	_, err := blockTimeout.Call(context.Background(), p, newGate())
	if !errors.Is(err, knit.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	v, err := blockDefault.Call(context.Background(), p, newGate())
	if err != nil || v != "fallback" {
		t.Fatalf("TimeoutDefault gave %q, %v", v, err)
	}
	v, err = blockDefault.Go(context.Background(), p, newGate()).Wait()
	if err != nil || v != "fallback" {
		t.Fatalf("TimeoutDefault future gave %q, %v", v, err)
	}
}

func TestDefinePanics(t *testing.T) {
	mustPanic := func(name, want string, f func()) {
		t.Helper()
		defer func() {
			v := recover()
			if v == nil || !strings.Contains(fmt.Sprint(v), want) {
				t.Errorf("%s: panic %v, want one mentioning %q", name, v, want)
			}
		}()
		f()
	}
	mustPanic("duplicate", "defined twice", func() {
		knit.Define("test.add", func(context.Context, int) (int, error) { return 0, nil })
	})
	mustPanic("unsupported", "chan int", func() {
		knit.Define("test.chan", func(context.Context, chan int) (int, error) { return 0, nil })
	})
	mustPanic("default type", "TimeoutDefault", func() {
		knit.Define("test.baddefault", func(context.Context, int) (int, error) { return 0, nil },
			knit.TimeoutDefault(time.Second, "not an int"))
	})
}

func TestDefineRefusesNegativeTimeouts(t *testing.T) {
	for name, opt := range map[string]knit.TaskOption{
		"Timeout":        knit.Timeout(-1),
		"HardTimeout":    knit.HardTimeout(-5),
		"TimeoutDefault": knit.TimeoutDefault(-1, 0),
		"nil":            nil,
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), "test.codec.negative."+name) {
					t.Errorf("%s: Define did not panic naming the task: %v", name, r)
				}
			}()
			knit.Define("test.codec.negative."+name, func(context.Context, int) (int, error) { return 0, nil }, opt)
		}()
	}
}

// TestHelperManyTasksHost is not a test: TestManyTasksProcessPool runs the test binary with
// envManyTasks as a host of a process pool serving every one of its 100,000 tasks. It calls
// the first and the last, kills the lane, calls again once the lane is back, and prints what
// it saw.
func TestHelperManyTasksHost(t *testing.T) {
	if os.Getenv(envManyTasks) == "" {
		t.Skip("helper process only")
	}
	fmt.Printf("heap per task: %d\n", manyHeap/uint64(len(manyDefs)))
	// Every lane defines 100,000 tasks before it boots, a race-built one slowly: the
	// startup timeout is for a hung lane, not a slow one.
	p, err := knit.NewPool(knit.Config{Runtime: knit.Process, Lanes: 1, Logger: quiet(), StartupTimeout: 10 * time.Minute}, manyDefs...)
	if err != nil {
		fmt.Println("NewPool:", err)
		return
	}
	defer p.Close(context.Background())
	events := p.Events()
	call := func(i int) {
		task := manyDefs[i].(*knit.Task[int64, int64])
		if got, err := task.Call(context.Background(), p, 1); err != nil || got != 1+int64(i) {
			fmt.Printf("task %d: %d, %v\n", i, got, err)
			return
		}
		fmt.Printf("served %d\n", i)
	}
	call(0)
	call(manyTaskCount - 1)
	if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
		fmt.Println("kill:", err)
		return
	}
	// Bounded, so that a lane that does not come back is a report, not a hung test.
	back := time.NewTimer(3 * time.Minute)
	defer back.Stop()
	for ready := false; !ready; {
		select {
		case e := <-events:
			if ready = e.Lane == 0 && e.Incarnation >= 1 && e.To == knit.StateReady; ready {
				fmt.Printf("back as incarnation %d\n", e.Incarnation)
			}
		case <-back.C:
			recent, _ := p.RecentEvents(0)
			fmt.Printf("lane 0 not ready again 3 minutes after its kill: %+v\nevents: %+v\n", p.Stats().Lanes, recent)
			return
		}
	}
	call(manyTaskCount / 2)
	fmt.Println("closed:", p.Close(context.Background()))
}

// TestManyTasksProcessPool: a process pool of 100,000 tasks starts, serves calls to any of
// them, and restarts its lane. Its boot record (3.5 MB) used to travel in an environment
// variable, and exec refused it past 128 KiB ("argument list too long", about 1,900 tasks);
// and each task kept 41 KB of heap until it was first called (4 GB for 100,000, in the host
// and in every lane).
func TestManyTasksProcessPool(t *testing.T) {
	if testing.Short() {
		t.Skip("defines 100,000 tasks in three processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A helper that hangs dumps its goroutines (SIGQUIT) into the output logged below.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestHelperManyTasksHost$", "-test.count=1", "-test.v")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = time.Minute
	cmd.Env = append(os.Environ(), envManyTasks+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	var said []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		said = append(said, sc.Text())
	}
	t.Logf("helper host:\n%s", out)
	if err != nil {
		t.Fatalf("helper host: %v", err)
	}
	var perTask int
	for _, l := range said {
		fmt.Sscanf(l, "heap per task: %d", &perTask)
	}
	if perTask == 0 || perTask > maxHeapPerTask {
		t.Errorf("each task keeps %d bytes of heap, want 1 to %d", perTask, maxHeapPerTask)
	}
	// The restart takes the spare, which must read a boot record of 3.5 MB before it is
	// ready: a race-built one on a loaded machine takes longer than Liveness, and it was
	// killed for that (and the next one too) until a running spare got StartupTimeout.
	for _, want := range []string{"served 0", fmt.Sprintf("served %d", manyTaskCount-1), "back as incarnation 1",
		fmt.Sprintf("served %d", manyTaskCount/2), "closed: <nil>"} {
		found := false
		for _, l := range said {
			found = found || l == want
		}
		if !found {
			t.Errorf("helper host did not say %q", want)
		}
	}
}
