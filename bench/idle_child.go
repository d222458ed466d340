//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/knitgo/knit"
)

// The idle rows run in a process of their own (this binary re-executed in the childIdle
// role): the harness process has run every row before, and its garbage collection, its
// scavenger and its peers' leftovers (the pools and children of earlier rows) would
// otherwise be billed to the idle pool. The child starts the pool, makes its calls,
// measures (measureKnitIdle) and prints the idleResult as JSON; its "host" is itself.

// Environment of an idle child: the pool's runtime and lane count, and the window.
const (
	idleEnvRuntime = "KNIT_BENCH_IDLE_RUNTIME"
	idleEnvLanes   = "KNIT_BENCH_IDLE_LANES"
	idleEnvWindow  = "KNIT_BENCH_IDLE_WINDOW"
)

// measureKnitIdleChild measures cfg's idle pool in a child process.
func measureKnitIdleChild(cfg knit.Config, res *result) error {
	cmd, err := childCmd(childIdle)
	if err != nil {
		return err
	}
	cmd.Env = append(cmd.Env, idleEnvRuntime+"="+cfg.Runtime.String(),
		idleEnvLanes+"="+strconv.Itoa(cfg.Lanes), idleEnvWindow+"="+idleWindow.String())
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("idle child: %w", err)
	}
	var idle idleResult
	if err := json.Unmarshal(out.Bytes(), &idle); err != nil {
		return fmt.Errorf("idle child's report %q: %w", out.String(), err)
	}
	res.Idle = &idle
	return nil
}

// idleChildMain is the childIdle role.
func idleChildMain() int {
	cfg, window, err := idleChildConfig()
	if err == nil {
		idleWindow = window
		var res result
		if err = measureKnitIdle(cfg, &res); err == nil {
			err = json.NewEncoder(os.Stdout).Encode(res.Idle)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench idle child:", err)
		return 1
	}
	return 0
}

func idleChildConfig() (knit.Config, time.Duration, error) {
	var cfg knit.Config
	switch rt := os.Getenv(idleEnvRuntime); rt {
	case knit.Goroutine.String():
		cfg.Runtime = knit.Goroutine
	case knit.Process.String():
		cfg.Runtime = knit.Process
	default:
		return cfg, 0, fmt.Errorf("%s=%q", idleEnvRuntime, rt)
	}
	lanes, err := strconv.Atoi(os.Getenv(idleEnvLanes))
	if err != nil || lanes < 1 {
		return cfg, 0, fmt.Errorf("%s=%q", idleEnvLanes, os.Getenv(idleEnvLanes))
	}
	cfg.Lanes = lanes
	window, err := time.ParseDuration(os.Getenv(idleEnvWindow))
	if err != nil || window <= 0 {
		return cfg, 0, fmt.Errorf("%s=%q", idleEnvWindow, os.Getenv(idleEnvWindow))
	}
	return cfg, window, nil
}
