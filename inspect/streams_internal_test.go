package inspect

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit"
)

// streamServer serves an inspector of a fresh pool whose open and ended streams are
// announced on the returned channels.
func streamServer(t *testing.T) (*inspector, *httptest.Server, chan struct{}, chan struct{}) {
	t.Helper()
	p, err := knit.NewPool(knit.Config{Lanes: 1, Logger: zap.NewNop()}, inspectTestTask, inspectTestExit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	in := Handler(p).(*inspector)
	started, ended := make(chan struct{}, 1024), make(chan struct{}, 1024)
	in.started = func() { started <- struct{}{} }
	in.ended = func() { ended <- struct{}{} }
	srv := httptest.NewServer(in)
	t.Cleanup(srv.Close)
	return in, srv, started, ended
}

// mute opens a stream from a client that sends its request and never reads a byte.
func mute(t *testing.T, srv *httptest.Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "GET /stream?interval=100ms HTTP/1.1\r\nHost: inspector\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// await takes one signal from ch; a test that would otherwise hang fails instead.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(2 * time.Minute):
		t.Fatalf("no %s", what)
	}
}

func (in *inspector) open_() int {
	in.smu.Lock()
	defer in.smu.Unlock()
	return len(in.streams)
}

// A stream reader that follows the SSE protocol far enough for these tests.
type sseReader struct {
	resp *http.Response
	r    *bufio.Reader
}

type sseMessage struct {
	retry, id string
	data      string
}

func readStream(t *testing.T, url, lastID string) *sseReader {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %s", resp.Status)
	}
	return &sseReader{resp: resp, r: bufio.NewReader(resp.Body)}
}

func (s *sseReader) next() (sseMessage, error) {
	var m sseMessage
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return m, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			return m, nil
		case strings.HasPrefix(line, "retry: "):
			m.retry = line[7:]
		case strings.HasPrefix(line, "id: "):
			m.id = line[4:]
		case strings.HasPrefix(line, "data: "):
			m.data = line[6:]
		}
	}
}

// TestInspectorMuteClientsDoNotLockOut: 64 clients that never read hold every stream slot;
// an operator still gets a stream (the oldest mute one ends for it), and the JSON endpoints
// answer. (With a slot per stream until a write blocked, kernel socket buffers absorbed the
// mute clients' streams for minutes, and new streams were refused with 503 meanwhile.)
func TestInspectorMuteClientsDoNotLockOut(t *testing.T) {
	in, srv, started, ended := streamServer(t)
	for range inspectMaxStreams {
		mute(t, srv)
		await(t, started, "mute stream opened")
	}
	if n := in.open_(); n != inspectMaxStreams {
		t.Fatalf("%d streams open, want %d", n, inspectMaxStreams)
	}
	s := readStream(t, srv.URL+"/stream", "")
	m, err := s.next()
	if err != nil || m.data == "" {
		t.Fatalf("the operator's stream: %+v, %v", m, err)
	}
	await(t, ended, "stream ended for the operator's") // the oldest mute one
	if n := in.open_(); n != inspectMaxStreams {
		t.Fatalf("%d streams open after the operator's took a slot, want %d", n, inspectMaxStreams)
	}
	for _, path := range []string{"/stats", "/config", "/events", "/lanes", "/snapshot"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s with every stream slot taken: %s", path, resp.Status)
		}
	}
}

// TestInspectorDropsMuteClient: a client that never reads loses its stream at its write
// deadline, though the socket buffers absorb every message the stream writes until then.
func TestInspectorDropsMuteClient(t *testing.T) {
	defer func(d time.Duration) { inspectWriteTimeout = d }(inspectWriteTimeout)
	inspectWriteTimeout = time.Second
	in, srv, started, ended := streamServer(t)
	mute(t, srv)
	await(t, started, "mute stream opened")
	await(t, ended, "mute client dropped")
	if n := in.open_(); n != 0 {
		t.Fatalf("%d streams open after the mute client was dropped", n)
	}
}

// TestInspectorStreamResumes: a stream ends before its deadline, having asked its client to
// reconnect at once; reconnecting with Last-Event-ID, the client gets the events after that
// one only, so that it sees one unbroken stream.
func TestInspectorStreamResumes(t *testing.T) {
	defer func(d time.Duration) { inspectWriteTimeout = d }(inspectWriteTimeout)
	inspectWriteTimeout = time.Second
	in, srv, _, _ := streamServer(t)
	s := readStream(t, srv.URL+"/stream", "")
	first, err := s.next()
	if err != nil {
		t.Fatal(err)
	}
	if first.retry != strconv.FormatInt(inspectRetry.Milliseconds(), 10) || first.id == "" || first.id == "0" {
		t.Fatalf("first message %+v: want retry %v and the id of the last event", first, inspectRetry)
	}
	last := first
	for {
		m, err := s.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the stream broke instead of ending: %v", err)
		}
		last = m
	}
	// A lane restart adds events after the ones the client has seen.
	since, _ := strconv.ParseUint(last.id, 10, 64)
	if _, err := inspectTestExit.Call(context.Background(), in.p, 0); err == nil {
		t.Fatal("the exiting task returned")
	}
	for {
		seq, changed := in.p.LastEvent()
		if seq > since {
			break
		}
		<-changed
	}
	s = readStream(t, srv.URL+"/stream", last.id)
	m, err := s.next()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m.data, `"Events":[{"Seq":`+strconv.FormatUint(since+1, 10)+",") {
		t.Fatalf("resumed after event %d: %s", since, m.data)
	}
}

// inspectTestExit ends its goroutine lane: the lane exits and restarts.
var inspectTestExit = knit.Define("test.inspector.internal.exit", func(context.Context, int) (int, error) {
	runtime.Goexit()
	return 0, nil
})
