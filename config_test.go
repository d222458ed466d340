package knit_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// TestConfigChecked: a Config value that crashed the host, exhausted its memory or was
// silently replaced is refused at NewPool with INVALID_ARGUMENT naming the field.
func TestConfigChecked(t *testing.T) {
	for name, c := range map[string]struct {
		cfg   knit.Config
		field string
	}{
		"EventBuffer 1<<62":   {knit.Config{EventBuffer: 1 << 62}, "EventBuffer"},
		"EventBuffer 1<<31":   {knit.Config{EventBuffer: 1 << 31}, "EventBuffer"},
		"EventBuffer -1":      {knit.Config{EventBuffer: -1}, "EventBuffer"},
		"Runtime 7":           {knit.Config{Runtime: 7}, "Runtime"},
		"Runtime -1":          {knit.Config{Runtime: -1}, "Runtime"},
		"Lanes -1":            {knit.Config{Lanes: -1}, "Lanes"},
		"Lanes 1025":          {knit.Config{Lanes: 1025}, "Lanes"},
		"Backlog 1<<40":       {knit.Config{Backlog: 1 << 40}, "Backlog"},
		"Balancer 9":          {knit.Config{Balancer: 9}, "Balancer"},
		"Steal 9":             {knit.Config{Steal: 9}, "Steal"},
		"LaneSpin 1h":         {knit.Config{LaneSpin: time.Hour}, "LaneSpin"},
		"Liveness 1ns":        {knit.Config{Liveness: time.Nanosecond}, "Liveness"},
		"Payload.Inline 100":  {knit.Config{Payload: knit.Payload{Inline: 100}}, "Payload.Inline"},
		"Payload.Arena 1<<40": {knit.Config{Payload: knit.Payload{Arena: 1 << 40}}, "Payload.Arena"},
		"Restart.Type 5":      {knit.Config{Restart: knit.Restart{Type: 5}}, "Restart.Type"},
		"Spares 1000":         {knit.Config{Process: knit.ProcessConfig{Spares: 1000}}, "Process.Spares"},
		"SharedMemory 3":      {knit.Config{Process: knit.ProcessConfig{SharedMemory: 3}}, "Process.SharedMemory"},
		"MaxCallsPerLane -1":  {knit.Config{MaxCallsPerLane: -1}, "MaxCallsPerLane"},
	} {
		p, err := knit.NewPool(c.cfg, add)
		if err == nil {
			_ = p.Close(context.Background())
			t.Errorf("%s: NewPool succeeded", name)
			continue
		}
		if !errors.Is(err, knit.ErrInvalidArgument) || !strings.Contains(err.Error(), "Config."+c.field) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming Config.%s", name, err, c.field)
		}
	}
	// The bounds themselves are accepted.
	p, err := knit.NewPool(knit.Config{Lanes: 2, EventBuffer: 1 << 16, Backlog: 1 << 16}, add)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := <-p.Events(); !ok {
		t.Error("no event")
	}
	_ = p.Close(context.Background())
}

// definedLate is a task defined after the pool of TestCallerMistakesHaveTheirCodes was
// made, once per test binary (a second Define of its name panics: go test -count=2).
var definedLate = sync.OnceValue(func() *knit.Task[int, int] {
	return knit.Define("test.defined.late", func(context.Context, int) (int, error) { return 0, nil })
})

// TestCallerMistakesHaveTheirCodes: a programming error is INVALID_ARGUMENT or
// UNKNOWN_TASK, never POOL_UNAVAILABLE (which says no lane can serve, a 503).
func TestCallerMistakesHaveTheirCodes(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 1})
	late := definedLate()
	var nilTask *knit.Task[[2]int64, int64]
	var nilPool *knit.Pool
	var nilCtx context.Context
	for name, c := range map[string]struct {
		err  error
		code knit.Code
	}{
		"no tasks":         {errOf(knit.NewPool(knit.Config{})), knit.CodeInvalidArgument},
		"not served":       {errOf(unserved.Call(context.Background(), p, 1)), knit.CodeUnknownTask},
		"defined late":     {errOf(late.Call(context.Background(), p, 1)), knit.CodeUnknownTask},
		"Resize(0)":        {p.Resize(context.Background(), 0), knit.CodeInvalidArgument},
		"nil pool":         {errOf(add.Call(context.Background(), nilPool, [2]int64{})), knit.CodeInvalidArgument},
		"nil task":         {errOf(nilTask.Call(context.Background(), p, [2]int64{})), knit.CodeInvalidArgument},
		"nil context":      {errOf(add.Call(nilCtx, p, [2]int64{})), knit.CodeInvalidArgument},
		"nil context, Go":  {errOf(add.Go(nilCtx, p, [2]int64{}).Wait()), knit.CodeInvalidArgument},
		"nil context, Res": {p.Resize(nilCtx, 2), knit.CodeInvalidArgument},
	} {
		wantCode(t, name, c.err, c.code)
	}
}

func errOf[T any](_ T, err error) error { return err }

// TestStatsEnumsAreNames: every enum in Stats and Config marshals as its name.
func TestStatsEnumsAreNames(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 2, Steal: knit.StealTicket})
	b, err := json.Marshal(p.Stats())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"Steal":"ticket"`, `"Runtime":"goroutine"`, `"State":"ready"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("Stats JSON lacks %s: %s", want, b)
		}
	}
	c := p.Config()
	b, err = json.Marshal(struct {
		Balancer knit.Balancer
		Steal    knit.Steal
		Restart  knit.Restart
		Shm      knit.SharedMemoryMode
		Cgroup   knit.CgroupMode
	}{c.Balancer, c.Steal, c.Restart, c.Process.SharedMemory, c.Process.Limits.Cgroup})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"Balancer":"least-loaded"`, `"Steal":"ticket"`, `"Type":"transient"`, `"Strategy":"one-for-one"`,
		`"OnIntensity":"crash-loop"`, `"Shm":"inherit"`, `"Cgroup":"auto"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("Config JSON lacks %s: %s", want, b)
		}
	}
	var s knit.Stats // and they read back
	if err := json.Unmarshal(mustJSON(t, p.Stats()), &s); err != nil || s.Steal != knit.StealTicket || s.Lanes[0].State != knit.StateReady {
		t.Errorf("Stats read back: %v, %+v", err, s)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
