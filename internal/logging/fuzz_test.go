package logging

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// FuzzParseLaneLine feeds ParseLaneLine hostile lines (it must never panic, and Emit must
// not either), and checks that what LaneLogger writes with the same text as its message and
// a field, and n as its time, parses back to the same entry.
//
// Lines are capped at maxFuzzLine bytes: a long input that finds new coverage costs the
// fuzzer's minimizer time quadratic in its length, during which the run stalls (and on Go
// 1.26 a run that ends mid-minimization can fail with "context deadline exceeded",
// go.dev/issue/75804). Nothing in the parser depends on a line being long.
func FuzzParseLaneLine(f *testing.F) {
	f.Add(`{"knit":1,"t":5,"level":"info","ns":"lifecycle","msg":"hi","lane":0,"incarnation":1,"pid":2}`, int64(3))
	f.Add(`{"knit":1,"level":"debug","msg":"x","o":{"a":[1,2.5,"s",null,true]},"big":1e400}`, int64(-1))
	f.Add(`{"knit":1,"level":"fatal","msg":"x","lane":1,"lane":"dup"}`, int64(0))
	f.Add("{\"knit\":1,\"level\":\"info\",\"msg\":\"\\ud800\"}", int64(1<<62))
	f.Add("{\"knit\":1,\"level\":\"info\",\"msg\":\"a\nb\x00\xff\"}", int64(7))
	f.Add(`{"knit":1,`, int64(0))
	host := zap.New(NewCore(io.Discard, ParseDebug("*"))).Named(Root)
	var buf bytes.Buffer // a fuzz worker runs one input at a time
	lane := LaneLogger(&buf, 5, 2, 3, epoch0, ParseDebug("*")).Named(Steal)
	f.Fuzz(func(t *testing.T, line string, n int64) {
		if len(line) > maxFuzzLine {
			return
		}
		if e, ok := ParseLaneLine(line); ok {
			e.Emit(host)
		}

		msg, val := line, line[len(line)/2:]
		buf.Reset()
		lane.WithOptions(zap.WithClock(fixedClock{epoch0.Add(time.Duration(n))})).
			Warn(msg, zap.String("val", val), zap.Int64("n", n))
		out := buf.String()
		if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
			t.Fatalf("LaneLogger wrote %q, want one line", out)
		}
		e, ok := ParseLaneLine(strings.TrimSuffix(out, "\n"))
		if !ok {
			t.Fatalf("ParseLaneLine rejected LaneLogger's line %q", out)
		}
		if e.Level != zapcore.WarnLevel || e.NS != Steal || e.Lane != 5 || e.Incarnation != 2 || e.PID != 3 ||
			e.Time != time.Duration(n) {
			t.Fatalf("parsed %+v from %q", e, out)
		}
		m := fieldMap(e.Fields)
		if m["n"] != n || len(m) != 2 {
			t.Fatalf("fields %v from %q", m, out)
		}
		// zap replaces invalid UTF-8, byte by byte, so only valid text comes back unchanged.
		if utf8.ValidString(msg) && e.Message != msg {
			t.Fatalf("message %q came back as %q", msg, e.Message)
		}
		if utf8.ValidString(val) && m["val"] != val {
			t.Fatalf("field %q came back as %q", val, m["val"])
		}
	})
}

const maxFuzzLine = 256
