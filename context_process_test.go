package knit_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/knitgo/knit"
)

// A task on a process lane sees its caller's deadline; a call without one has none.
func TestProcessLaneSeesCallerDeadline(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1}, deadlineOf)
	want := time.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), want)
	defer cancel()
	got, err := deadlineOf.Call(ctx, p, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != want.UnixNano() {
		t.Fatalf("lane saw deadline %v, caller's is %v", time.Unix(0, got), want)
	}
	got, err = deadlineOf.Call(context.Background(), p, 0)
	if err != nil || got != 0 {
		t.Fatalf("without a deadline: %d, %v", got, err)
	}
}

// With Config.Propagator (and WithPropagator in the lane's knit.Main, as TestMain has), a
// trace goes on in a process lane; without it the lane sees none.
func TestProcessLaneCarriesTrace(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
		SpanID:     trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	for _, tc := range []struct {
		name string
		prop propagation.TextMapPropagator
		want string
	}{
		{"propagator", propagation.TraceContext{}, sc.TraceID().String()},
		{"none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProcessPool(t, knit.Config{Lanes: 1, Propagator: tc.prop}, traceOf)
			got, err := traceOf.Call(ctx, p, 0)
			if err != nil || got != tc.want {
				t.Fatalf("lane saw trace %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
