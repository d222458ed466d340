//go:build linux

package main

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// actorScenarios: row 5 of the README — a protoactor-go actor that replies
// in+1 to every uint64 it receives, called with RequestFuture(...).Result().
func actorScenarios() []scenario {
	return []scenario{
		{name: "protoactor: RequestFuture round trip", inFlight: 1, setup: setupActorRoundTrip},
		{name: fmt.Sprintf("protoactor: %d futures in flight", inFlightTarget), inFlight: inFlightTarget, setup: setupActorThroughput},
	}
}

const actorTimeout = 10 * time.Second

func newIncActor() (*actor.ActorSystem, *actor.PID, func() error) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if v, ok := c.Message().(uint64); ok {
			c.Respond(v + 1)
		}
	}))
	cleanup := func() error {
		err := sys.Root.StopFuture(pid).Wait()
		sys.Shutdown()
		return err
	}
	return sys, pid, cleanup
}

func actorCall(sys *actor.ActorSystem, pid *actor.PID, v uint64) error {
	res, err := sys.Root.RequestFuture(pid, v, actorTimeout).Result()
	if err != nil {
		return fmt.Errorf("protoactor: %w", err)
	}
	if got, ok := res.(uint64); !ok || got != v+1 {
		return fmt.Errorf("protoactor: got %v, want %d", res, v+1)
	}
	return nil
}

func setupActorRoundTrip() (func(*testing.B), func() error, error) {
	sys, pid, cleanup := newIncActor()
	var v uint64
	body := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			v++
			if err := actorCall(sys, pid, v); err != nil {
				fail(b, err)
				return
			}
		}
	}
	return body, cleanup, nil
}

func setupActorThroughput() (func(*testing.B), func() error, error) {
	sys, pid, cleanup := newIncActor()
	body := func(b *testing.B) {
		runInFlight(b, func(pb *testing.PB) {
			var v uint64
			for pb.Next() {
				v++
				if err := actorCall(sys, pid, v); err != nil {
					fail(b, err)
					return
				}
			}
		})
	}
	return body, cleanup, nil
}
