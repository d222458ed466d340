// Quickstart defines two tasks, runs them on a pool of goroutine lanes with a blocking
// call and a few futures, shows how a failed call is classified, and closes the pool.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/knitgo/knit"
)

// Tasks are defined once, at package level, so the host and every lane know them.
var (
	add = knit.Define("quickstart.add", func(_ context.Context, in [2]int64) (int64, error) {
		return in[0] + in[1], nil
	}, knit.Timeout(500*time.Millisecond))

	upper = knit.Define("quickstart.upper", func(_ context.Context, s string) (string, error) {
		return strings.ToUpper(s), nil
	})
)

func main() {
	knit.Main() // always first: in a process lane it serves tasks; in the host it returns at once

	pool, err := knit.NewPool(knit.Config{Lanes: 2}, add, upper) // goroutine lanes by default
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close(context.Background())
	ctx := context.Background()

	// A blocking call.
	sum, err := add.Call(ctx, pool, [2]int64{1, 2})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("1 + 2 =", sum)

	// Futures: start several calls, then wait for each.
	var futs []*knit.Future[string]
	for _, w := range []string{"knit", "runs", "tasks"} {
		futs = append(futs, upper.Go(ctx, pool, w))
	}
	for _, f := range futs {
		s, err := f.Wait()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("upper:", s)
	}

	// Every failure is a *knit.Error with a code. A call whose deadline has passed fails with
	// ErrTimeout (and still wraps context.DeadlineExceeded), as does an add call that runs
	// past its own 500ms Timeout.
	late, cancel := context.WithDeadline(ctx, time.Now())
	defer cancel()
	_, err = add.Call(late, pool, [2]int64{3, 4})
	var kerr *knit.Error
	if errors.Is(err, knit.ErrTimeout) && errors.As(err, &kerr) {
		fmt.Println("timed out as expected, code", kerr.Code)
	} else {
		log.Fatalf("expected a timeout, got %v", err)
	}
}
