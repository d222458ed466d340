package inspect_test

import (
	"context"
	"os"
	"runtime"
	"testing"

	"go.uber.org/goleak"

	"github.com/knitgo/knit"
)

func TestMain(m *testing.M) {
	knit.Main() // process lanes of the tests start here
	if _, ok := os.LookupEnv("GORACE"); !ok {
		// Race-built lanes would sleep 1 s at every exit: Close would wait for it.
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	goleak.VerifyTestMain(m)
}

var (
	add = knit.Define("test.inspect.add", func(_ context.Context, in [2]int64) (int64, error) {
		return in[0] + in[1], nil
	})
	goexit = knit.Define("test.inspect.goexit", func(context.Context, int) (int, error) {
		runtime.Goexit()
		return 0, nil
	})
)

func newPool(t testing.TB, cfg knit.Config) *knit.Pool {
	t.Helper()
	p, err := knit.NewPool(cfg, add, goexit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func newProcessPool(t testing.TB, cfg knit.Config) *knit.Pool {
	t.Helper()
	cfg.Runtime = knit.Process
	return newPool(t, cfg)
}
