package knit_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/lifecycle"
)

// truncOwnRegion resizes the lane's region file wherever the lane holds it.
var truncOwnRegion = knit.Define("test.fds.truncate", func(_ context.Context, size int64) (string, error) {
	return fmt.Sprint(unix.Ftruncate(lifecycle.RegionFD(), size)), nil
})

// TestNamedLaneBehindClosingWrapper: a Named lane behind a wrapper that closes inherited
// descriptors boots, serves and restarts (from a spare behind the same wrapper), though the
// Go runtime holds some of fds 3 to 5 in it by then (its cgroup files, its netpoller): the
// lane serves from wherever its descriptors came instead of closing the runtime's files to
// put them on 3 to 5 (replacing the netpoller's epoll descriptor is fatal at its next poll).
// Its region is still sealed against resizing.
func TestNamedLaneBehindClosingWrapper(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Logger: quiet(), Process: knit.ProcessConfig{
		SharedMemory: knit.Named,
		Prefix:       []string{"sh", "-c", `exec 3>&- 4>&- 5>&- 6>&-; exec "$@"`, "sh"},
	}}, add, truncOwnRegion)
	events := p.Events()
	check := func(when string) {
		t.Helper()
		if sum, err := add.Call(context.Background(), p, [2]int64{40, 2}); err != nil || sum != 42 {
			t.Fatalf("%s: call: %d, %v", when, sum, err)
		}
		if got, err := truncOwnRegion.Call(context.Background(), p, 0); err != nil || got != unix.EPERM.Error() {
			t.Fatalf("%s: ftruncate of the lane's region: %q, %v; want %q", when, got, err, unix.EPERM.Error())
		}
	}
	check("first boot")
	if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for e := range events {
		if e.Lane == 0 && e.Incarnation == 1 && e.To == knit.StateReady {
			break
		}
	}
	check("after the restart")
}
