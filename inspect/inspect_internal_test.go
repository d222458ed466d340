package inspect

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// stalledWriter is a connection whose client stopped reading: a write waits for the
// connection's write deadline, as one into a full socket buffer does.
type stalledWriter struct {
	header http.Header
	mu     sync.Mutex
	dl     time.Time
	writes int
	set    chan struct{} // closed once a deadline is set
	once   sync.Once
}

func (w *stalledWriter) Header() http.Header { return w.header }
func (w *stalledWriter) WriteHeader(int)     {}
func (w *stalledWriter) Flush()              {}

func (w *stalledWriter) SetWriteDeadline(t time.Time) error {
	w.mu.Lock()
	w.dl = t
	w.mu.Unlock()
	if !t.IsZero() {
		w.once.Do(func() { close(w.set) })
	}
	return nil
}

func (w *stalledWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.writes++
	dl := w.dl
	w.mu.Unlock()
	if dl.IsZero() {
		select {} // no deadline: stuck for good, and the test times out
	}
	time.Sleep(time.Until(dl)) // the deadline passes: the kernel would fail the write then
	return 0, os.ErrDeadlineExceeded
}

// A stream whose client stops reading ends at its write deadline; nothing of the pool waits
// for it meanwhile.
func TestInspectorDropsStalledClient(t *testing.T) {
	defer func(d time.Duration) { inspectWriteTimeout = d }(inspectWriteTimeout)
	inspectWriteTimeout = 50 * time.Millisecond
	p, err := knit.NewPool(knit.Config{Lanes: 1}, inspectTestTask)
	if err != nil {
		t.Fatal(err)
	}
	w := &stalledWriter{header: http.Header{}, set: make(chan struct{})}
	req := httptest.NewRequest(http.MethodGet, "/stream", nil)
	done := make(chan struct{})
	go func() {
		Handler(p).ServeHTTP(w, req)
		close(done)
	}()
	<-w.set // the stream is writing its first message, and stalls there
	_ = p.Stats()
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-done // it returns: the write failed at its deadline
	if w.writes != 1 || !w.dl.IsZero() {
		t.Fatalf("%d writes, deadline left %v; want 1 write and the deadline cleared", w.writes, w.dl)
	}
}

var inspectTestTask = knit.Define("test.inspector.internal", func(_ context.Context, n int) (int, error) { return n, nil })
