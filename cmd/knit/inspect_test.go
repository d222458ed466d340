package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/inspect"
)

func TestMain(m *testing.M) {
	knit.Main()
	goleak.VerifyTestMain(m)
}

func inspectedPool(t *testing.T, lanes int) (*knit.Pool, *httptest.Server) {
	t.Helper()
	p, err := knit.NewPool(knit.Config{Lanes: lanes}, demoSquare, demoGoexit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	srv := httptest.NewServer(inspect.Handler(p))
	t.Cleanup(srv.Close)
	return p, srv
}

// Not on a terminal, knit inspect prints one snapshot: every lane, and the events so far.
func TestInspectOnce(t *testing.T) {
	p, srv := inspectedPool(t, 3)
	if _, err := demoSquare.Call(context.Background(), p, 3); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"inspect", strings.TrimPrefix(srv.URL, "http://")}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	text := out.String()
	for _, want := range []string{"knit inspect  knit-pool-", "[live]", "runtime goroutine  lanes 3/3 ready",
		"LANE", "STATE", "IN FLIGHT", "BACKLOG", "COMPLETED", "lifecycle (latest"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	// (Columns after RSS: fields Stats gained later, such as RECYCLES.)
	rows := regexp.MustCompile(`(?m)^\s+[0-2]\s+ready\s+-\s+0\s+0\s+0\s+0\s+\d+\s+0\s+-(\s+\d+)*\s*$`).FindAllString(text, -1)
	if len(rows) != 3 {
		t.Errorf("want 3 lane rows, got %d:\n%s", len(rows), text)
	}
	if n := strings.Count(text, "booting → ready"); n != 3 {
		t.Errorf("want 3 boots in the timeline, got %d:\n%s", n, text)
	}
}

func TestInspectUsage(t *testing.T) {
	var out, errb bytes.Buffer
	for _, args := range [][]string{{"inspect"}, {"inspect", "a", "b"}, {"inspect", "ftp://x/"}, {"inspect", "-bogus", "x"}} {
		out.Reset()
		errb.Reset()
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	// Nothing listens there: an error, exit 1.
	srv := httptest.NewServer(nil)
	addr := srv.URL
	srv.Close()
	if code := run([]string{"inspect", addr}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "knit inspect:") {
		t.Errorf("unreachable inspector: exit %d, %q", code, errb.String())
	}
}

// The live view redraws in place: a lane's exit and restart appear in a later frame, and
// the view ends, leaving the last frame, when the pool closes.
func TestInspectLive(t *testing.T) {
	p, srv := inspectedPool(t, 2)
	base, err := inspectorURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := inspectLive(ctx, base, 100*time.Millisecond, w, func() (int, int) { return 120, 40 })
		w.CloseWithError(io.EOF)
		done <- err
	}()
	frames := frameReader{r: r}
	if f := frames.until(t, func(f string) bool { return strings.Contains(f, "lanes 2/2 ready") }); !strings.HasPrefix(f, "\x1b[?1049h") {
		t.Fatalf("the live view does not start on the alternate screen: %q", f[:min(len(f), 20)])
	}
	if _, err := demoGoexit.Call(ctx, p, 0); !errors.Is(err, knit.ErrWorkerExited) {
		t.Fatalf("goexit: %v", err)
	}
	frames.until(t, func(f string) bool {
		return strings.Contains(f, "ready → exited  WORKER_EXITED") && regexp.MustCompile(`lane \d inc 1 +booting → ready`).MatchString(f) &&
			strings.Contains(f, "restarts 1 ")
	})
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), "\x1b[?1049l") || !strings.Contains(string(rest), "[closed]") {
		t.Fatalf("after Close: %q", rest)
	}
}

// frameReader splits the live view's output into frames (each starts at cursor home).
type frameReader struct {
	r   io.Reader
	buf bytes.Buffer
}

func (fr *frameReader) until(t *testing.T, ok func(string) bool) string {
	t.Helper()
	var seen string
	chunk := make([]byte, 4096)
	for {
		for {
			s := fr.buf.String()
			i := strings.Index(s, "\x1b[J") // the end of a frame
			if i < 0 {
				break
			}
			frame := s[:i]
			fr.buf.Next(i + len("\x1b[J"))
			seen = frame
			if ok(frame) {
				return frame
			}
		}
		n, err := fr.r.Read(chunk)
		if err != nil {
			t.Fatalf("the live view ended (%v); last frame:\n%s", err, seen)
		}
		fr.buf.Write(chunk[:n])
	}
}

func TestInspectorURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:80":                      "http://127.0.0.1:80/",
		"http://h:1/debug/knit":             "http://h:1/debug/knit/",
		"https://h/debug/knit/?x=1#frag":    "https://h/debug/knit/",
		"http://127.0.0.1:5/debug/knit/ab/": "http://127.0.0.1:5/debug/knit/ab/",
	} {
		u, err := inspectorURL(in)
		if err != nil || u.String() != want {
			t.Errorf("inspectorURL(%q) = %v, %v; want %s", in, u, err, want)
		}
	}
}

func TestKeysInOrder(t *testing.T) {
	doc := []byte(`{"Stats":{"Zed":1,"Lanes":[{"Lane":0,"Beta":[1,{"Inner":2}],"Alpha":"x"}],"Tasks":[{"Task":"a","P50":1}]},"Events":[]}`)
	o := keysInOrder(doc)
	got := o.keys(map[string]any{"Alpha": 1, "Lane": 1, "Beta": 1, "Unknown": 1, "Another": 1})
	if want := []string{"Lane", "Beta", "Alpha", "Another", "Unknown"}; !slices.Equal(got, want) {
		t.Errorf("keys = %q, want %q (order %v)", got, want, o)
	}
	if o["Inner"] <= o["Beta"] || o["Alpha"] <= o["Inner"] || o["Task"] >= o["P50"] || o["Events"] != len(o)-1 {
		t.Errorf("order %v", o)
	}
	for in, want := range map[string]string{"TotalCompleted": "TOTAL COMPLETED", "P99": "P99", "PID": "PID", "Crashes": "CRASHES"} {
		if got := heading(in); got != want {
			t.Errorf("heading(%q) = %q, want %q", in, got, want)
		}
	}
}
