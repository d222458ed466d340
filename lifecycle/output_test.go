package lifecycle

import (
	"bytes"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/knitgo/knit/internal/logging"
)

// FuzzLaneOutput feeds what a hostile lane could write on stderr, in arbitrary pieces, to the
// host's output relay: it must never panic, and what it keeps for errors and logs is
// printable and bounded.
func FuzzLaneOutput(f *testing.F) {
	f.Add([]byte("hello\npanic: boom\n\ngoroutine 1 [running]:\nmain.main()\n\t/m.go:3 +0x1\n"), 7)
	f.Add([]byte("\x1b[2J\xff\n"+logging.LaneMarker+`"t":1,"level":"error","msg":"x\n"}`+"\n"), 3)
	f.Add(bytes.Repeat([]byte("x"), 70<<10), 1000)
	f.Fuzz(func(t *testing.T, data []byte, chunk int) {
		core, logs := observer.New(zap.DebugLevel)
		o := NewOutput(zap.New(core), 0)
		w := o.Writer(true)
		if chunk <= 0 {
			chunk = 1
		}
		for len(data) > 0 {
			n := min(chunk, len(data))
			w.Write(data[:n])
			data = data[n:]
		}
		o.Close()
		<-o.relayed
		tail, failure, crash := o.Report()
		msg := Classify(Exit{Ready: true, Status: 2, Failure: failure, Crash: crash, Tail: tail}).Error()
		if !utf8.ValidString(msg) || strings.IndexFunc(msg, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 || len(msg) > 8192 {
			t.Fatalf("crash message not cleaned or not bounded: %q", msg)
		}
		for _, s := range tail {
			if len(s) > logging.MaxLaneText || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
				t.Fatalf("tail line not cleaned: %q", s)
			}
		}
		for _, e := range logs.All() {
			if strings.ContainsAny(e.Message, "\n\x1b") {
				t.Fatalf("logged message with control characters: %q", e.Message)
			}
		}
	})
}

// TestLaneOutputDropsWhenSinkBlocks: with the sink blocked, the writer never blocks; the
// lines beyond the queue are dropped and counted, and reported once the sink moves.
func TestLaneOutputDropsWhenSinkBlocks(t *testing.T) {
	gate := make(chan struct{})
	core, logs := observer.New(zap.DebugLevel)
	blocking := zap.New(core, zap.Hooks(func(e zapcore.Entry) error {
		if e.Message == "lane stderr" {
			<-gate
		}
		return nil
	}))
	o := NewOutput(blocking, 0)
	w := o.Writer(true)
	const lines = 10 * outQueue
	for range lines {
		w.Write([]byte("line\n"))
	}
	if o.dropped.Load() == 0 {
		t.Fatal("nothing dropped with the sink blocked")
	}
	close(gate)
	o.Close()
	<-o.relayed
	reported := uint64(0)
	for _, e := range logs.FilterMessageSnippet("lines dropped").All() {
		reported += uint64(e.ContextMap()["dropped"].(uint64))
	}
	if reported != o.dropped.Load() || logs.FilterMessage("lane stderr").Len()+int(reported) != lines {
		t.Fatalf("dropped %d, reported %d, logged %d of %d", o.dropped.Load(), reported, logs.FilterMessage("lane stderr").Len(), lines)
	}
}

// TestLineWriterSplits: lines split across writes, several in one write, and an endless line
// cut in pieces of maxLine bytes.
func TestLineWriterSplits(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	o := NewOutput(zap.New(core), 0)
	w := o.Writer(false)
	w.Write([]byte("one\ntw"))
	w.Write([]byte("o\nthree\nfour"))
	w.Write([]byte("\n"))
	long := bytes.Repeat([]byte("y"), 2*maxLine+5)
	for i := range long { // a byte at a time
		w.Write(long[i : i+1])
	}
	w.Write([]byte("\n"))
	o.Close()
	<-o.relayed
	var got []string
	for _, e := range logs.FilterMessage("lane stdout").All() {
		got = append(got, e.ContextMap()["line"].(string))
	}
	if len(got) != 7 || strings.Join(got[:4], ",") != "one,two,three,four" || len(got[4]) != logging.MaxLaneText ||
		got[6] != "yyyyy" {
		t.Fatalf("lines %d: %.80q", len(got), got)
	}
}
