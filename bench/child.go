//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"
)

// childEnv selects the role of a re-executed bench binary. Unset (or empty)
// means "parent": run the benchmarks.
const childEnv = "KNIT_BENCH_CHILD"

// Child roles. Each child_*.go file implements one.
const (
	childUnix     = "unix"      // child_unix.go: echo 8-byte messages on a socket
	childShmSpin  = "shm-spin"  // child_shm.go: spin on a shared word, echo it
	childShmFutex = "shm-futex" // child_shm.go: futex-wait on a shared word, echo it
	childPlugin   = "plugin"    // child_plugin.go: hashicorp/go-plugin net/rpc server
	childIdle     = "knit-idle" // idle_child.go: measure an idle knit pool, print the result
	// childHog (load.go): a busy loop, for the rows under load
)

// runChildIfRequested runs the child role named by KNIT_BENCH_CHILD, if any.
// It is called first thing by main and by TestMain (under go test the
// re-executed binary is the test binary).
func runChildIfRequested() (exitCode int, isChild bool) {
	role := os.Getenv(childEnv)
	switch role {
	case "":
		return 0, false
	case childUnix:
		return unixChildMain(), true
	case childShmSpin:
		return shmChildMain(false), true
	case childShmFutex:
		return shmChildMain(true), true
	case childPlugin:
		pluginChildMain()
		return 0, true
	case childIdle:
		return idleChildMain(), true
	case childHog:
		return hogChildMain(), true
	case childKnitNode:
		return knitNodeMain(), true
	case childProtoactorEcho:
		return protoactorEchoMain(), true
	default:
		fmt.Fprintf(os.Stderr, "bench child: unknown %s=%q\n", childEnv, role)
		return 2, true
	}
}

// childCmd returns a command that re-executes this binary in the given
// role. Pdeathsig makes the kernel kill the child if the parent dies, so no
// child outlives a crashed or killed harness.
func childCmd(role string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+role)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd, nil
}

// child is a started child process that is always reaped: a goroutine
// waits for it from the start, so it never lingers as a zombie.
type child struct {
	role   string
	cmd    *exec.Cmd
	done   chan struct{} // closed once reaped
	exited atomic.Bool
	err    error // Wait's result; read only after done is closed
}

// startChild starts this binary in role with files as fds 3, 4, ... and
// closes the parent's copies of files once the child has them.
func startChild(role string, files ...*os.File) (*child, error) {
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	cmd, err := childCmd(role)
	if err != nil {
		return nil, err
	}
	cmd.ExtraFiles = files
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s child: %w", role, err)
	}
	c := &child{role: role, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		c.exited.Store(true)
		close(c.done)
	}()
	return c, nil
}

// wait waits for the child to exit on its own (the caller has closed the
// parent's end of its channel) and kills it if it has not exited within
// timeout. Either way the child is reaped when wait returns.
func (c *child) wait(timeout time.Duration) error {
	select {
	case <-c.done:
		if c.err != nil {
			return fmt.Errorf("%s child: %w", c.role, c.err)
		}
		return nil
	case <-time.After(timeout):
		c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s child did not exit within %v of its parent closing its end; killed", c.role, timeout)
	}
}

// kill kills and reaps the child (used on setup errors).
func (c *child) kill() {
	c.cmd.Process.Kill()
	<-c.done
}

// lifeline makes a pipe whose read end goes to a child that has no other
// channel to notice its parent leaving (the shared-memory children): the
// child exits when read returns EOF, i.e. when the parent closes the write
// end or dies.
func lifeline() (childEnd, parentEnd *os.File, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	return r, w, nil
}
