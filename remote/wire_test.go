package remote

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/knitgo/knit/actors"
)

func TestWireRoundTrip(t *testing.T) {
	s := Session{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	parse := func(b []byte, kind Kind) Frame {
		t.Helper()
		f, err := Parse(b)
		if err != nil {
			t.Fatalf("%v: %v", kind, err)
		}
		if f.Kind != kind || f.Session != s || f.Lane != 7 || f.Inc != 1<<20 {
			t.Fatalf("%v: header %+v", kind, f)
		}
		return f
	}
	h := func(k Kind) []byte { return AppendHeader(nil, k, s, 7, 1<<20) }

	open := Open{Reply: "10.0.0.1:4000", ReplyActor: "knit-host-3", Liveness: 3 * time.Second, Lanes: 12, Flags: OpenCarry,
		Inline: 512, Arena: 4 << 20, MaxCall: 1 << 20,
		Tasks: []TaskRef{{Name: "a", Fingerprint: 1<<63 + 5, Index: 0}, {Name: "b.c", Fingerprint: 9, Index: 41}}}
	got, err := parse(AppendOpen(h(KindOpen), &open), KindOpen).Open()
	if err != nil || !reflect.DeepEqual(got, open) {
		t.Errorf("open: %+v, %v", got, err)
	}

	pid, err := parse(AppendReady(h(KindReady), 4242), KindReady).Ready()
	if err != nil || pid != 4242 {
		t.Errorf("ready: %d, %v", pid, err)
	}
	code, msg, err := parse(AppendFailed(h(KindFailed), "WORKER_STARTUP_FAILED", "no"), KindFailed).Failed()
	if err != nil || code != "WORKER_STARTUP_FAILED" || msg != "no" {
		t.Errorf("failed: %s %s %v", code, msg, err)
	}

	calls := []Call{{Seq: 1, Fn: 3, Timeout: time.Second, Payload: []byte("in")}, {Seq: 1 << 40, Fn: 0, Timeout: -1}, {Seq: 3, NoCancel: true, Payload: bytes.Repeat([]byte{7}, 1000)}}
	b := h(KindCalls)
	for i := range calls {
		b = AppendCall(b, &calls[i])
	}
	it := parse(b, KindCalls).Items()
	for i := 0; it.More(); i++ {
		c := it.Call()
		if c.Seq != calls[i].Seq || c.Fn != calls[i].Fn || c.Timeout != calls[i].Timeout || c.NoCancel != calls[i].NoCancel || !bytes.Equal(c.Payload, calls[i].Payload) {
			t.Errorf("call %d: %+v", i, c)
		}
	}
	if it.Err() != nil {
		t.Error(it.Err())
	}

	results := []Result{{Seq: 9, Outcome: 2, Ran: 1234, Payload: []byte("out")}, {Seq: 10}}
	b = h(KindResults)
	for i := range results {
		b = AppendResult(b, &results[i])
	}
	it = parse(b, KindResults).Items()
	for i := 0; it.More(); i++ {
		if r := it.Result(); r.Seq != results[i].Seq || r.Outcome != results[i].Outcome || r.Ran != results[i].Ran || !bytes.Equal(r.Payload, results[i].Payload) {
			t.Errorf("result %d: %+v", i, r)
		}
	}

	it = parse(AppendCancel(AppendCancel(h(KindCancel), 5), 6), KindCancel).Items()
	if a, b := it.Cancel(), it.Cancel(); a != 5 || b != 6 || it.More() || it.Err() != nil {
		t.Errorf("cancel: %d %d %v", a, b, it.Err())
	}

	kill, reason, err := parse(AppendStop(h(KindStop), true, "why"), KindStop).Stop()
	if err != nil || !kill || reason != "why" {
		t.Errorf("stop: %v %q %v", kill, reason, err)
	}

	for _, end := range []Ended{
		{Code: "WORKER_CRASHED", Message: "killed by signal SIGSEGV", Started: 77, Busy: true, Began: 14,
			Stack: []string{"panic: x", "main.f"}, Tail: []string{"line"}},
		{Code: "WORKER_EXITED", Normal: true, Started: 3, Began: -1},
	} {
		gotEnd, err := parse(AppendEnded(h(KindEnded), &end), KindEnded).Ended()
		if err != nil || !reflect.DeepEqual(gotEnd, end) {
			t.Errorf("ended: %+v, %v", gotEnd, err)
		}
	}
	if _, err := parse(AppendEnded(h(KindEnded), &Ended{Began: maxBegan + 1}), KindEnded).Ended(); err == nil {
		t.Errorf("an Ended frame with %d elements of a chunk begun decoded", maxBegan+1)
	}
	if maxBegan != actors.MaxChunk {
		t.Errorf("maxBegan is %d, a chunk holds up to %d elements", maxBegan, actors.MaxChunk)
	}

	nonce, reply, actor, err := parse(AppendPing(h(KindPing), 3, "h:1", "knit-host-1"), KindPing).Ping()
	if err != nil || nonce != 3 || reply != "h:1" || actor != "knit-host-1" {
		t.Errorf("ping: %d %s %s %v", nonce, reply, actor, err)
	}
	nonce, known, err := parse(AppendPong(h(KindPong), 3, true), KindPong).Pong()
	if err != nil || nonce != 3 || !known {
		t.Errorf("pong: %d %v %v", nonce, known, err)
	}
}

// A frame is read as what it is and nothing else, and trailing bytes are an error.
func TestWireRefuses(t *testing.T) {
	s := Session{}
	ping := AppendPing(AppendHeader(nil, KindPing, s, 0, 0), 1, "a", "b")
	f, _ := Parse(ping)
	if _, err := f.Open(); !errors.Is(err, ErrFrame) {
		t.Errorf("a ping read as open: %v", err)
	}
	it := f.Items()
	if it.Call(); !errors.Is(it.Err(), ErrFrame) {
		t.Errorf("a ping read as calls: %v", it.Err())
	}
	f, _ = Parse(append(ping, 0))
	if _, _, _, err := f.Ping(); !errors.Is(err, ErrFrame) {
		t.Errorf("a ping with a trailing byte: %v", err)
	}
	other := append([]byte(nil), ping...)
	other[2] = Version + 1
	if _, err := Parse(other); !errors.Is(err, ErrVersion) {
		t.Errorf("another version: %v", err)
	}
	for _, b := range [][]byte{nil, {'k'}, []byte("kn"), append([]byte("kn\x01\x00"), make([]byte, 16)...), append([]byte("kn\x01\x7f"), make([]byte, 17)...)} {
		if _, err := Parse(b); err == nil {
			t.Errorf("%q parsed", b)
		}
	}
	// A length that claims more than the frame holds.
	b := AppendHeader(nil, KindCalls, s, 0, 0)
	b = AppendCall(b, &Call{Seq: 1, Payload: []byte("abc")})
	f, _ = Parse(b[:len(b)-1])
	it = f.Items()
	for it.More() {
		it.Call()
	}
	if !errors.Is(it.Err(), ErrFrame) {
		t.Errorf("a truncated call: %v", it.Err())
	}
}

// FuzzFrame: no frame makes a decoder panic, read past its input or allocate beyond its
// bounds; whatever decodes encodes back to what decodes the same.
func FuzzFrame(f *testing.F) {
	s := Session{9}
	h := func(k Kind) []byte { return AppendHeader(nil, k, s, 1, 2) }
	f.Add(AppendOpen(h(KindOpen), &Open{Reply: "x:1", ReplyActor: "knit-host-1", Liveness: time.Second, Lanes: 2,
		Tasks: []TaskRef{{Name: "t", Fingerprint: 1}}}))
	f.Add(AppendReady(h(KindReady), 1))
	f.Add(AppendFailed(h(KindFailed), "c", "m"))
	f.Add(AppendCall(AppendCall(h(KindCalls), &Call{Seq: 1, Payload: []byte("p")}), &Call{Seq: 2, Timeout: -1}))
	f.Add(AppendResult(h(KindResults), &Result{Seq: 1, Outcome: 1, Payload: []byte("r")}))
	f.Add(AppendCancel(h(KindCancel), 4))
	f.Add(AppendStop(h(KindStop), true, "r"))
	f.Add(AppendEnded(h(KindEnded), &Ended{Code: "c", Stack: []string{"a"}, Tail: []string{"b"}}))
	f.Add(AppendPing(h(KindPing), 1, "a", "b"))
	f.Add(AppendPong(h(KindPong), 1, true))
	f.Add(h(KindBye))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Parse(b)
		if err != nil {
			return
		}
		re := AppendHeader(nil, fr.Kind, fr.Session, fr.Lane, fr.Inc)
		switch fr.Kind {
		case KindOpen:
			if o, err := fr.Open(); err == nil {
				o2, err := mustParse(t, AppendOpen(re, &o)).Open()
				if err != nil || !reflect.DeepEqual(o, o2) {
					t.Fatalf("open %+v re-read as %+v, %v", o, o2, err)
				}
			}
		case KindReady:
			_, _ = fr.Ready()
		case KindFailed:
			_, _, _ = fr.Failed()
		case KindCalls, KindResults, KindCancel:
			it := fr.Items()
			for n := 0; it.More(); n++ {
				if n > len(b) {
					t.Fatalf("more items than bytes")
				}
				switch fr.Kind {
				case KindCalls:
					c := it.Call()
					if len(c.Payload) > MaxPayload {
						t.Fatalf("a payload of %d bytes", len(c.Payload))
					}
				case KindResults:
					it.Result()
				default:
					it.Cancel()
				}
			}
		case KindStop:
			_, _, _ = fr.Stop()
		case KindEnded:
			if e, err := fr.Ended(); err == nil {
				if len(e.Stack) > maxLines || len(e.Tail) > maxLines {
					t.Fatalf("%d and %d lines", len(e.Stack), len(e.Tail))
				}
				e2, err := mustParse(t, AppendEnded(re, &e)).Ended()
				if err != nil || !reflect.DeepEqual(e, e2) {
					t.Fatalf("ended %+v re-read as %+v, %v", e, e2, err)
				}
			}
		case KindPing:
			_, _, _, _ = fr.Ping()
		case KindPong:
			_, _, _ = fr.Pong()
		}
	})
}

func mustParse(t *testing.T, b []byte) Frame {
	t.Helper()
	f, err := Parse(b)
	if err != nil {
		t.Fatalf("re-encoded frame: %v", err)
	}
	return f
}
