package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/knitgo/knit"
)

func TestMain(m *testing.M) {
	knit.Main()
	if _, ok := os.LookupEnv("GORACE"); !ok {
		os.Setenv("GORACE", "atexit_sleep_ms=0") // race-built lanes would sleep at exit
	}
	goleak.VerifyTestMain(m)
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

var labelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

func parse(t *testing.T, r io.Reader) []sample {
	t.Helper()
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			s.name, rest = line[:i], line[j+1:]
			for _, m := range labelRE.FindAllStringSubmatch(line[i+1:j], -1) {
				s.labels[m[1]] = m[2]
			}
		} else {
			f := strings.Fields(line)
			s.name, rest = f[0], strings.Join(f[1:], " ")
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out
}

// value sums the samples named name whose labels include want (name, value, …).
func value(samples []sample, name string, want ...string) (float64, bool) {
	total, found := 0.0, false
next:
	for _, s := range samples {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(want); i += 2 {
			if s.labels[want[i]] != want[i+1] {
				continue next
			}
		}
		total, found = total+s.value, true
	}
	return total, found
}

// After a known sequence — N calls, one call that kills its lane, the restart — a scrape of
// the example's endpoint finds the exact counts.
func TestScrapeFindsExactCounts(t *testing.T) {
	ready := make(chan struct{})
	s, err := newServer(knit.Config{Lanes: 1, OnEvent: func(e knit.Event) {
		if e.Lane == 0 && e.Incarnation == 1 && e.To == knit.StateReady {
			close(ready)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	srv := httptest.NewServer(s.Handler)
	defer srv.Close()

	ctx := context.Background()
	const n = 25
	for i := range int64(n) {
		if v, err := square.Call(ctx, s.Pool, i); err != nil || v != i*i {
			t.Fatalf("square(%d) = %d, %v", i, v, err)
		}
	}
	if _, err := crash.Call(ctx, s.Pool, 0); !errors.Is(err, knit.ErrWorkerCrashed) {
		t.Fatalf("crash: %v, want WORKER_CRASHED", err)
	}
	select {
	case <-ready:
	case <-time.After(time.Minute):
		t.Fatal("the lane did not come back")
	}
	if v, err := square.Call(ctx, s.Pool, 3); err != nil || v != 9 {
		t.Fatalf("square after the restart: %d, %v", v, err)
	}

	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s, %v", resp.Status, err)
	}
	samples := parse(t, strings.NewReader(string(body)))
	for _, w := range []struct {
		name  string
		attrs []string
		want  float64
	}{
		{"knit_calls_started_total", []string{"knit_task", "metrics.square"}, n + 1},
		{"knit_calls_started_total", []string{"knit_task", "metrics.crash"}, 1},
		{"knit_calls_finished_total", []string{"knit_task", "metrics.square", "knit_outcome", "OK"}, n + 1},
		{"knit_calls_finished_total", []string{"knit_task", "metrics.crash", "knit_outcome", "WORKER_CRASHED"}, 1},
		{"knit_call_duration_seconds_count", []string{"knit_task", "metrics.square", "knit_outcome", "OK"}, n + 1},
		{"knit_call_run_duration_seconds_count", []string{"knit_task", "metrics.square"}, n + 1},
		{"knit_call_wait_duration_seconds_count", []string{"knit_task", "metrics.square"}, n + 1},
		{"knit_lane_crashes_total", []string{"knit_lane", "0", "knit_code", "WORKER_CRASHED"}, 1},
		{"knit_lane_restarts_total", []string{"knit_lane", "0", "knit_code", "WORKER_CRASHED"}, 1},
		{"knit_lane_state", []string{"knit_lane", "0", "knit_lane_state", "ready"}, 1},
		{"knit_lane_state", []string{"knit_lane", "0"}, 1},
		{"knit_lane_calls_inflight", []string{"knit_lane", "0"}, 0},
		{"knit_lane_calls_queued", []string{"knit_lane", "0"}, 0},
	} {
		got, ok := value(samples, w.name, w.attrs...)
		if !ok || got != w.want {
			t.Errorf("%s%v = %v (found: %v), want %v", w.name, w.attrs, got, ok, w.want)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", body)
	}
}
