package knit_test

import (
	"bytes"
	"os"
	"runtime"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/goleak"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/remote"
)

func TestMain(m *testing.M) {
	knit.Main(knit.WithPropagator(propagation.TraceContext{}))
	if _, ok := os.LookupEnv("GORACE"); !ok {
		// Race-built lanes would sleep 1 s at every exit: Close would wait for it.
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	goleak.VerifyTestMain(pinned{m})
}

// pinned runs the tests with the process's remote endpoint started once for all of them
// (remote.Pin): protoactor's remote cannot start twice in a process under the race detector.
type pinned struct{ m *testing.M }

func (p pinned) Run() int {
	unpin := remote.Pin()
	code := p.m.Run()
	unpin()
	awaitEndpointWriters()
	return code
}

// awaitEndpointWriters waits for protoactor's endpoint writers that are still in their
// connection attempt when the endpoint stops: one that failed to reach a node a test killed
// sleeps 2 s in its actor before it looks again (protoactor-go's endpointWriter.initialize,
// which nothing can interrupt), longer than goleak waits. protoactor offers no event to wait
// on, so this looks at the goroutines' stacks, for at most 10 s.
func awaitEndpointWriters() {
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for time.Now().Before(deadline) {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte("remote.(*endpointWriter).initialize")) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
