// Isolation runs tasks that crash their lane in every way a Go process can die — a memory
// fault, os.Exit, a panic in a goroutine nobody recovers, running out of the memory its
// Process.Prefix allows — on process lanes, and shows the host serving on: each failure comes
// back as a coded error naming the faulting frame, and a task panic that the lane can recover
// fails only its own call.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/knitgo/knit"
)

var (
	add = knit.Define("isolation.add", func(_ context.Context, in [2]int64) (int64, error) {
		return in[0] + in[1], nil
	})
	// segfault writes to a read-only page: a real SIGSEGV the Go runtime cannot recover.
	segfault = knit.Define("isolation.segfault", func(context.Context, int) (int, error) {
		page, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return 0, err
		}
		page[0] = 1
		return 0, nil
	})
	exit = knit.Define("isolation.exit", func(_ context.Context, code int) (int, error) {
		os.Exit(code)
		return 0, nil
	})
	lostPanic = knit.Define("isolation.gopanic", func(context.Context, int) (int, error) {
		done := make(chan struct{})
		go func() { panic("nobody recovers this") }()
		<-done
		return 0, nil
	})
	taskPanic = knit.Define("isolation.panic", func(context.Context, int) (int, error) {
		panic("recovered by the lane")
	})
	// hog asks for n bytes of heap (never touched: a limit refuses it before any is used).
	hog = knit.Define("isolation.hog", func(_ context.Context, n int) (int, error) {
		return len(make([]byte, n)), nil
	})
)

func main() {
	knit.Main()
	ctx := context.Background()
	pool, err := knit.NewPool(knit.Config{Lanes: 4, Runtime: knit.Process, Balancer: knit.FirstIdle},
		add, segfault, exit, lostPanic, taskPanic)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close(ctx)

	report := func(what string, err error) {
		var ke *knit.Error
		if errors.As(err, &ke) {
			fmt.Printf("%-28s -> %s on lane %d%s\n", what, ke.Code, ke.Lane, where(ke.Message))
			return
		}
		fmt.Printf("%-28s -> %v\n", what, err)
	}
	_, err = taskPanic.Call(ctx, pool, 0)
	report("panic in the task", err)
	_, err = segfault.Call(ctx, pool, 0)
	report("segmentation fault", err)
	_, err = exit.Call(ctx, pool, 3)
	report("os.Exit(3)", err)
	_, err = lostPanic.Call(ctx, pool, 0)
	report("unrecovered goroutine panic", err)

	sum, err := add.Call(ctx, pool, [2]int64{40, 2})
	fmt.Printf("%-28s -> %d, %v\n", "the host still serves", sum, err)
	for _, l := range pool.Stats().Lanes {
		fmt.Printf("lane %d: %s\n", l.Lane, l.State)
	}

	// Memory: a lane limited to 500 MB of heap (RLIMIT_DATA; not --as, which an idle Go
	// process's 1.7 GB of reserved address space already exceeds) asks for 1 GB.
	if _, err := exec.LookPath("prlimit"); err != nil {
		fmt.Println("prlimit is not installed: skipping the memory limit")
		return
	}
	limited, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: knit.Process,
		Process: knit.ProcessConfig{Prefix: []string{"prlimit", "--data=500000000"}}}, add, hog)
	if err != nil {
		log.Fatal(err)
	}
	defer limited.Close(ctx)
	_, err = hog.Call(ctx, limited, 1<<30)
	report("1 GB over a 500 MB limit", err)
	sum, err = add.Call(ctx, limited, [2]int64{40, 2})
	fmt.Printf("%-28s -> %d, %v\n", "the limited lane is back", sum, err)
}

// where picks the failure line and the first frame of the faulting goroutine out of a crash
// message ("fatal error: fault (exit status 2) | [signal ...] | goroutine 1 [running]: |
// main.init.func2(…) at /src/main.go:24 | ...").
func where(msg string) string {
	parts := strings.Split(msg, " | ")
	for i, p := range parts {
		if strings.HasPrefix(p, "goroutine ") && i+1 < len(parts) {
			return ": " + parts[0] + ", in " + parts[i+1]
		}
	}
	return ""
}
