package steal

import (
	"fmt"
	"io"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/knitgo/knit/internal/logging"
)

// Micro benchmarks of the protocol alone, one goroutine: the host publishes a burst of
// Width calls, consumers take turns claiming, releasing, starting and finishing them. They
// measure the instructions and atomics of a claim, not contention. 0 allocs/op.
func BenchmarkClaim(b *testing.B) {
	for _, d := range disciplines {
		for n := 1; n <= 4; n++ {
			b.Run(fmt.Sprintf("%v/consumers=%d", d, n), func(b *testing.B) {
				r := newRing(b, Config{Consumers: n, Discipline: d})
				p := r.Producer(nil)
				cs := make([]*Consumer, n)
				for i := range cs {
					cs[i] = consumer(b, r, i)
				}
				width := r.Config().Width
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; {
					for k := 0; k < width && i+k < b.N; k++ {
						slot, ok := p.Reserve()
						if !ok {
							b.Fatal("ring full")
						}
						p.Stage(slot)
					}
					p.Flush()
					c := cs[i%n]
					for {
						got, err := c.Claim()
						if err != nil {
							b.Fatal(err)
						}
						if got == 0 {
							break
						}
						c.Release()
						for k := range got {
							c.Start(k)
							c.Finish(k)
						}
						i += got
					}
				}
			})
		}
	}
}

// BenchmarkIdlePoll: a claim on an empty ring (two loads).
func BenchmarkIdlePoll(b *testing.B) {
	for _, d := range disciplines {
		b.Run(d.String(), func(b *testing.B) {
			r := newRing(b, Config{Consumers: 4, Discipline: d})
			c := consumer(b, r, 0)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if n, _ := c.Claim(); n != 0 {
					b.Fatal("claimed from an empty ring")
				}
			}
		})
	}
}

// BenchmarkPublish: the host's side of a burst of 8 calls (reserve, stage, one flush), with
// a consumer retiring them between bursts.
func BenchmarkPublish(b *testing.B) {
	for _, d := range disciplines {
		b.Run(d.String(), func(b *testing.B) {
			r := newRing(b, Config{Consumers: 2, Discipline: d, Width: 8})
			p := r.Producer(nil)
			c := consumer(b, r, 0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += 8 {
				for range 8 {
					slot, _ := p.Reserve()
					p.Stage(slot)
				}
				p.Flush()
				b.StopTimer()
				for got := 0; got < 8; {
					n, _ := c.Claim()
					c.Release()
					for k := range n {
						c.Start(k)
						c.Finish(k)
					}
					got += n
				}
				b.StartTimer()
			}
		})
	}
}

// TestClaimDoesNotAllocate: claiming, releasing, starting and finishing allocate nothing
// (the CI runs allocation checks without -race).
func TestClaimDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	for _, d := range disciplines {
		r := newRing(t, Config{Consumers: 3, Discipline: d})
		root := logging.New(zap.New(logging.NewCore(io.Discard, logging.ParseDebug("lane"))), 0)
		p := r.Producer(root)
		c, err := r.Consumer(1, root) // a logger whose steal namespace is off
		if err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(200, func() {
			slot, _ := p.Reserve()
			p.Stage(slot)
			p.Flush()
			n, _ := c.Claim()
			c.Release()
			for k := range n {
				c.Start(k)
				c.Finish(k)
			}
		})
		if allocs != 0 {
			t.Fatalf("%v: %v allocations per call", d, allocs)
		}
	}
}

// TestDebugLog: with the steal namespace on, claims (with their batch size, once released)
// and journal recoveries are logged under knit.steal.
func TestDebugLog(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	root := logging.New(zap.New(core), 0)
	r := newRing(t, Config{Consumers: 2})
	p := r.Producer(root)
	c, err := r.Consumer(0, root)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, p, 0, 3)
	if n, _ := c.Claim(); n != 3 {
		t.Fatalf("claimed %d", n)
	}
	if len(logs.FilterMessage("claimed").All()) != 0 {
		t.Fatal("a claim logged before its release: a slow logger would hold the handshake")
	}
	c.Release()
	if _, err := p.Recover(0); err != nil {
		t.Fatal(err)
	}
	claimed := logs.FilterMessage("claimed").All()
	if len(claimed) != 1 || claimed[0].LoggerName != "knit.steal" || claimed[0].ContextMap()["batch"] != int64(3) {
		t.Fatalf("claim entries: %+v", claimed)
	}
	rec := logs.FilterMessage("journal recovered").All()
	if len(rec) != 1 || rec[0].ContextMap()["fresh"] != int64(3) {
		t.Fatalf("recovery entries: %+v", rec)
	}
}
