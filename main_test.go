package knit_test

import (
	"os"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.uber.org/goleak"

	"github.com/knitgo/knit"
)

func TestMain(m *testing.M) {
	knit.Main(knit.WithPropagator(propagation.TraceContext{}))
	if _, ok := os.LookupEnv("GORACE"); !ok {
		// Race-built lanes would sleep 1 s at every exit: Close would wait for it.
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	goleak.VerifyTestMain(m)
}
