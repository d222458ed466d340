package inspect_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/inspect"
)

// inspected mounts an inspector for p under /debug/knit/, as the docs suggest.
func inspected(t *testing.T, p *knit.Pool) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/debug/knit/", http.StripPrefix("/debug/knit", inspect.Handler(p)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, b := get(t, url)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %s %q: %s", url, resp.Status, resp.Header.Get("Content-Type"), b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v in %s", url, err, b)
	}
}

// inspectedEvents is the /events document.
type inspectedEvents struct {
	Events []struct {
		Seq uint64
		knit.Event
	}
	Missed uint64
}

// laneView is a lane as /lanes and /stats serve it.
type laneView struct {
	knit.LaneStats
	RSS int64
}

func TestInspectorJSON(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 3})
	srv := inspected(t, p)
	base := srv.URL + "/debug/knit/"

	// /stats decodes into Stats itself: the whole value, states by name.
	var st knit.Stats
	getJSON(t, base+"stats", &st)
	if len(st.Lanes) != 3 || st.Runtime != knit.Goroutine || st.Closed {
		t.Fatalf("stats: %+v", st)
	}
	for i, l := range st.Lanes {
		if l.Lane != i || l.State != knit.StateReady || l.Incarnation != 0 {
			t.Errorf("stats lane %d: %+v", i, l)
		}
	}
	var raw map[string]any
	getJSON(t, base+"stats", &raw)
	if raw["Runtime"] != "goroutine" || raw["Lanes"].([]any)[0].(map[string]any)["State"] != "ready" {
		t.Errorf("stats should name runtime and states: %v", raw)
	}
	if host := raw["Host"].(map[string]any); host["PID"].(float64) <= 0 || host["RSS"].(float64) <= 0 {
		t.Errorf("stats host: %v", host)
	}

	if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil {
		t.Fatal(err)
	}
	var lanes []laneView
	getJSON(t, base+"lanes", &lanes)
	completed := uint64(0)
	for _, l := range lanes {
		completed += l.Completed
		if l.PID != 0 || l.RSS != 0 {
			t.Errorf("goroutine lane %d has a process: %+v", l.Lane, l)
		}
	}
	if len(lanes) != 3 || completed != 1 {
		t.Fatalf("lanes after one call: %+v", lanes)
	}

	// Every lane's first boot is in the events, numbered from 1.
	var ev inspectedEvents
	getJSON(t, base+"events", &ev)
	ready := map[int]bool{}
	for i, e := range ev.Events {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d numbered %d", i, e.Seq)
		}
		if e.To == knit.StateReady && e.Incarnation == 0 {
			ready[e.Lane] = true
		}
	}
	if len(ready) != 3 || ev.Missed != 0 {
		t.Fatalf("events: %+v", ev)
	}
	var after inspectedEvents
	getJSON(t, base+"events?since=2", &after)
	if len(after.Events) != len(ev.Events)-2 || after.Events[0].Seq != 3 {
		t.Fatalf("events since 2: %+v of %d", after, len(ev.Events))
	}
	getJSON(t, base+"events?since=1000", &after)
	if after.Events == nil || len(after.Events) != 0 {
		t.Fatalf("events since 1000: %+v, want an empty list", after)
	}

	var cfg map[string]any
	getJSON(t, base+"config", &cfg)
	if cfg["Lanes"] != 3.0 || cfg["Runtime"] != "goroutine" || cfg["Balancer"] != "least-loaded" || cfg["Process"] != nil {
		t.Fatalf("config: %v", cfg)
	}

	var snap struct {
		Pool   string
		Stats  knit.Stats
		Events []knit.Event
		Final  bool
	}
	getJSON(t, base+"snapshot", &snap)
	if !strings.HasPrefix(snap.Pool, "knit-pool-") || len(snap.Stats.Lanes) != 3 || len(snap.Events) != len(ev.Events) || snap.Final {
		t.Fatalf("snapshot: %+v", snap)
	}

	resp, page := get(t, base)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(string(page), `new EventSource("stream")`) {
		t.Fatalf("page: %s %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	// Mounted at /debug/knit, the bare prefix redirects to the page, whose links are relative.
	resp, _ = get(t, srv.URL+"/debug/knit")
	if resp.Request.URL.Path != "/debug/knit/" || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /debug/knit ended at %s: %s", resp.Request.URL, resp.Status)
	}

	// Mounted with StripPrefix("/"), the page comes as "": it is served, not redirected.
	root := httptest.NewServer(http.StripPrefix("/", inspect.Handler(p)))
	defer root.Close()
	if resp, page := get(t, root.URL+"/"); resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "EventSource") {
		t.Fatalf("page at the root: %s", resp.Status)
	}
	var rootLanes []laneView
	getJSON(t, root.URL+"/lanes", &rootLanes)

	for path, code := range map[string]int{"nope": 404, "events?since=x": 400, "snapshot?since=-1": 400, "stream?interval=soon": 400} {
		if resp, b := get(t, base+path); resp.StatusCode != code {
			t.Errorf("GET %s: %s %s, want %d", path, resp.Status, b, code)
		}
	}
	if resp, err := http.Head(base + "stream"); err != nil || resp.StatusCode != http.StatusOK ||
		resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("HEAD stream: %v, %v", resp, err)
	} else {
		resp.Body.Close()
	}
	resp, err := http.Post(base+"stats", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST stats: %s", resp.Status)
	}
}

// A process lane shows its pid and memory; a SIGKILL and the restart show up as events
// with their code and reason; the configuration shows no Env value.
func TestInspectorProcessLanes(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 2, Process: knit.ProcessConfig{Env: []string{"KNIT_TEST_SECRET=hunter2"}}})
	srv := inspected(t, p)
	base := srv.URL + "/debug/knit/"

	var lanes []laneView
	getJSON(t, base+"lanes", &lanes)
	st := p.Stats()
	for i, l := range lanes {
		if l.PID <= 0 || l.PID != st.Lanes[i].PID || l.RSS <= 0 {
			t.Fatalf("process lane %d: %+v (stats %+v)", i, l, st.Lanes[i])
		}
	}

	_, cfg := get(t, base+"config")
	if strings.Contains(string(cfg), "hunter2") || !strings.Contains(string(cfg), `"Env":["KNIT_TEST_SECRET"]`) ||
		!strings.Contains(string(cfg), `"Runtime":"process"`) {
		t.Fatalf("config: %s", cfg)
	}

	if err := syscall.Kill(lanes[1].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for e := range p.Events() {
		if e.Lane == 1 && e.To == knit.StateReady && e.Incarnation == 1 {
			break
		}
	}
	var ev inspectedEvents
	getJSON(t, base+"events", &ev)
	var crashed, restarted bool
	for _, e := range ev.Events {
		if e.Lane != 1 {
			continue
		}
		switch {
		case e.To == knit.StateCrashed && e.Code == knit.CodeWorkerCrashed && strings.Contains(e.Reason, "SIGKILL"):
			crashed = true
		case e.To == knit.StateReady && e.Incarnation == 1:
			restarted = crashed
		}
	}
	if !crashed || !restarted {
		t.Fatalf("events after SIGKILL: %+v", ev.Events)
	}
	getJSON(t, base+"lanes", &lanes)
	if lanes[1].Incarnation != 1 || lanes[1].Restarts != 1 || lanes[1].PID == st.Lanes[1].PID || lanes[1].RSS <= 0 {
		t.Fatalf("lane 1 after its restart: %+v", lanes[1])
	}
}

// sse reads the inspector's stream.
type sse struct {
	body io.Closer
	r    *bufio.Reader
}

type streamMessage struct {
	ID     string
	Pool   string
	Stats  knit.Stats
	Events []struct {
		Seq uint64
		knit.Event
	}
	Final bool
}

func openStream(t *testing.T, ctx context.Context, url string) *sse {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		resp.Body.Close()
		t.Fatalf("stream: %s %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &sse{body: resp.Body, r: bufio.NewReader(resp.Body)}
}

// next reads one message; io.EOF when the server ended the stream.
func (s *sse) next() (streamMessage, error) {
	var m streamMessage
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return m, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			return m, nil
		case strings.HasPrefix(line, "id: "):
			m.ID = line[4:]
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(line[6:]), &m); err != nil {
				return m, err
			}
		}
	}
}

// The stream shows a lane's exit and its restart as they happen, then ends when its client
// goes away (the handler returns: TestMain's goleak checks).
func TestInspectorStream(t *testing.T) {
	p := newPool(t, knit.Config{Lanes: 2})
	srv := inspected(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openStream(t, ctx, srv.URL+"/debug/knit/stream?interval=100ms")
	m, err := s.next()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Stats.Lanes) != 2 || len(m.Events) == 0 || m.ID != strings.TrimSpace(jsonNumber(m.Events[len(m.Events)-1].Seq)) {
		t.Fatalf("first message: %+v", m)
	}

	if _, err := goexit.Call(ctx, p, 1); !errors.Is(err, knit.ErrWorkerExited) {
		t.Fatalf("goexit: %v", err)
	}
	var exited, restarted, shown bool
	for !exited || !restarted || !shown {
		if m, err = s.next(); err != nil {
			t.Fatalf("stream ended before the restart showed: %v", err)
		}
		for _, e := range m.Events {
			switch {
			case e.To == knit.StateExited && e.Code == knit.CodeWorkerExited:
				exited = true
			case e.To == knit.StateReady && e.Incarnation == 1:
				restarted = exited
			}
		}
		for _, l := range m.Stats.Lanes {
			shown = shown || (restarted && l.Incarnation == 1 && l.State == knit.StateReady && l.Restarts == 1)
		}
	}
	cancel()
	if _, err := s.next(); err == nil {
		t.Fatal("the stream goes on after its client went away")
	}
}

func jsonNumber(n uint64) string { b, _ := json.Marshal(n); return string(b) }

// Close ends every stream, after a last message saying so.
func TestInspectorStreamEndsOnClose(t *testing.T) {
	p, err := knit.NewPool(knit.Config{Lanes: 1}, add)
	if err != nil {
		t.Fatal(err)
	}
	srv := inspected(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openStream(t, ctx, srv.URL+"/debug/knit/stream?interval=1m")
	if _, err := s.next(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var last streamMessage
	for {
		m, err := s.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		last = m
	}
	if !last.Final || !last.Stats.Closed || last.Stats.Lanes[0].State != knit.StateClosed {
		t.Fatalf("last message: %+v", last)
	}
	// A stream opened on a closed pool gets its one message and ends.
	s = openStream(t, ctx, srv.URL+"/debug/knit/stream")
	if m, err := s.next(); err != nil || !m.Final {
		t.Fatalf("stream of a closed pool: %+v, %v", m, err)
	}
	if _, err := s.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the final message: %v, want EOF", err)
	}
}

// /config does not show a secret passed to the lanes through the prefix (env TOKEN=...) or
// Process.Env; RevealSecrets shows both.
func TestInspectorConfigRedactsSecrets(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Process: knit.ProcessConfig{
		Prefix: []string{"env", "TOKEN=secret"}, Env: []string{"KNIT_TEST_KEY=hunter2"}}})
	srv := httptest.NewServer(inspect.Handler(p))
	defer srv.Close()
	_, cfg := get(t, srv.URL+"/config")
	if strings.Contains(string(cfg), "secret") || strings.Contains(string(cfg), "hunter2") ||
		!strings.Contains(string(cfg), `"Prefix":["env","TOKEN=[redacted]"]`) || !strings.Contains(string(cfg), `"Env":["KNIT_TEST_KEY"]`) {
		t.Fatalf("config: %s", cfg)
	}
	open := httptest.NewServer(inspect.Handler(p, inspect.RevealSecrets()))
	defer open.Close()
	_, cfg = get(t, open.URL+"/config")
	if !strings.Contains(string(cfg), `"Prefix":["env","TOKEN=secret"]`) || !strings.Contains(string(cfg), `"Env":["KNIT_TEST_KEY=hunter2"]`) {
		t.Fatalf("config with RevealSecrets: %s", cfg)
	}
}
