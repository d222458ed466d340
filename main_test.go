package knit_test

import (
	"os"
	"testing"

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
	defer unpin()
	return p.m.Run()
}
