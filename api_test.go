package knit_test

import (
	"context"
	"errors"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/knitgo/knit"
)

// A Future's settling belongs to knit: its method set is reading only. (A Fail method once
// let a user settle an unsettled future, which made the lane panic and Close hang.)
func TestFutureMethodsReadOnly(t *testing.T) {
	typ := reflect.TypeFor[*knit.Future[int]]()
	var names []string
	for i := range typ.NumMethod() {
		names = append(names, typ.Method(i).Name)
	}
	sort.Strings(names)
	if want := []string{"Done", "Pending", "Wait"}; !reflect.DeepEqual(names, want) {
		t.Errorf("*knit.Future methods %v, want %v", names, want)
	}
}

// Every exported method, in orders a user might call them — futures settled and unsettled,
// Close twice, calls after Close — neither panics a lane nor hangs Close.
func TestAPIInAnyOrder(t *testing.T) {
	for _, rt := range []knit.Runtime{knit.Goroutine, knit.Process} {
		t.Run(rt.String(), func(t *testing.T) {
			p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: rt, Logger: quiet(), StopAckTimeout: 10 * time.Second}, add, sleepy)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			unsettled := sleepy.Go(ctx, p, 0)
			if !unsettled.Pending() {
				t.Fatal("a blocked call's future is settled")
			}
			select {
			case <-unsettled.Done():
				t.Fatal("Done closed for a blocked call")
			default:
			}
			settled := add.Go(context.Background(), p, [2]int64{1, 2})
			if v, err := settled.Wait(); err != nil || v != 3 {
				t.Fatalf("Wait: %d, %v", v, err)
			}
			if v, err := settled.Wait(); err != nil || v != 3 || settled.Pending() {
				t.Fatalf("second Wait: %d, %v", v, err)
			}
			<-settled.Done()
			_ = p.Stats()
			_ = p.PID()
			_ = p.Events()
			if _, err := add.Call(context.Background(), p, [2]int64{2, 2}); err != nil {
				t.Fatal(err)
			}
			cancel()
			if _, err := unsettled.Wait(); !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled future: %v", err)
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := add.Call(context.Background(), p, [2]int64{1, 1}); !errors.Is(err, knit.ErrPoolClosed) {
				t.Errorf("call after Close: %v", err)
			}
			if _, err := add.Go(context.Background(), p, [2]int64{1, 1}).Wait(); !errors.Is(err, knit.ErrPoolClosed) {
				t.Errorf("Go after Close: %v", err)
			}
			if s := p.Stats(); !s.Closed {
				t.Errorf("Stats after Close: %+v", s)
			}
			for range p.Events() { // closed by Close
			}
		})
	}
}
