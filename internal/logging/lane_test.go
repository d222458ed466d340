package logging

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

var epoch0 = time.Unix(1_700_000_000, 0)

// fixedClock makes entry times, and so "t", exact.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time                         { return c.t }
func (c fixedClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

func laneLines(t *testing.T, debug string, log func(l *zap.Logger)) []string {
	t.Helper()
	var buf bytes.Buffer
	l := LaneLogger(&buf, 3, 7, 4242, epoch0, ParseDebug(debug)).
		WithOptions(zap.WithClock(fixedClock{epoch0.Add(12345 * time.Microsecond)}))
	log(l)
	if buf.Len() == 0 {
		return nil
	}
	out := strings.TrimSuffix(buf.String(), "\n")
	return strings.Split(out, "\n")
}

func TestLaneLoggerRoundTrip(t *testing.T) {
	cases := []struct {
		name   string
		debug  string
		log    func(l *zap.Logger)
		want   *LaneEntry // nil: nothing written
		fields map[string]any
	}{
		{
			name:  "debug in an enabled namespace",
			debug: "lifecycle",
			log:   func(l *zap.Logger) { l.Named(Lifecycle).Debug("lane booting", zap.Int("tasks", 4)) },
			want:  &LaneEntry{Level: zapcore.DebugLevel, NS: Lifecycle, Message: "lane booting"},
			fields: map[string]any{
				"tasks": int64(4),
			},
		},
		{
			name:  "debug in a disabled namespace",
			debug: "steal",
			log:   func(l *zap.Logger) { l.Named(Lifecycle).Debug("lane booting") },
		},
		{
			name:  "info always",
			debug: "",
			log: func(l *zap.Logger) {
				l.Named(Codec).Info("decoded\nsecond line \"quoted\" ü", zap.String("s", "a\tb"), zap.Bool("b", true),
					zap.Float64("f", 1.5), zap.Duration("d", 1500*time.Microsecond), zap.Uint64("big", 1<<63),
					zap.Int64("neg", -9), zap.Strings("list", []string{"x", "y"}))
			},
			want: &LaneEntry{Level: zapcore.InfoLevel, NS: Codec, Message: "decoded\nsecond line \"quoted\" ü"},
			fields: map[string]any{
				"s": "a\tb", "b": true, "f": 1.5, "d": "1.5ms", "big": uint64(1 << 63), "neg": int64(-9),
				"list": []any{"x", "y"},
			},
		},
		{
			name:   "error from the root logger",
			debug:  "",
			log:    func(l *zap.Logger) { l.Error("boot failed", zap.Error(errors.New("no region"))) },
			want:   &LaneEntry{Level: zapcore.ErrorLevel, Message: "boot failed"},
			fields: map[string]any{"error": "no region"},
		},
		{
			name:   "a field named like the context is kept as a field",
			debug:  "*",
			log:    func(l *zap.Logger) { l.Named(Lane).Warn("odd", zap.Int("lane", 99)) },
			want:   &LaneEntry{Level: zapcore.WarnLevel, NS: Lane, Message: "odd"},
			fields: map[string]any{"lane": int64(99)},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lines := laneLines(t, tc.debug, tc.log)
			if tc.want == nil {
				if len(lines) != 0 {
					t.Fatalf("wrote %q, want nothing", lines)
				}
				return
			}
			if len(lines) != 1 || !strings.HasPrefix(lines[0], LaneMarker+`"t":12345000,`) {
				t.Fatalf("wrote %q, want one line starting with the marker and t", lines)
			}
			e, ok := ParseLaneLine(lines[0])
			if !ok {
				t.Fatalf("ParseLaneLine(%s) failed", lines[0])
			}
			want := *tc.want
			want.Time, want.Lane, want.Incarnation, want.PID = 12345*time.Microsecond, 3, 7, 4242
			got := e
			got.Fields = nil
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("parsed %+v, want %+v", got, want)
			}
			if m := fieldMap(e.Fields); !equalAny(m, tc.fields) {
				t.Fatalf("fields %#v, want %#v", m, tc.fields)
			}
		})
	}
}

// fieldMap encodes fields the way zap does for an observer.
func fieldMap(fs []zap.Field) map[string]any {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fs {
		f.AddTo(enc)
	}
	return enc.Fields
}

func equalAny(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok {
			return false
		}
		if l, ok := v.([]any); ok {
			m, ok := w.([]any)
			if !ok || len(l) != len(m) {
				return false
			}
			for i := range l {
				if l[i] != m[i] {
					return false
				}
			}
			continue
		}
		if v != w {
			return false
		}
	}
	return true
}

func TestParseLaneLineRejects(t *testing.T) {
	good := `{"knit":1,"t":5,"level":"info","ns":"lifecycle","msg":"hi","lane":0,"incarnation":1,"pid":2}`
	if _, ok := ParseLaneLine(good); !ok {
		t.Fatalf("the well-formed line was rejected")
	}
	for _, line := range []string{
		"",
		"panic: boom",
		"knit lane 0: unknown task",
		`{"level":"info","msg":"not ours"}`,
		` {"knit":1,"level":"info","msg":"space first"}`,
		`{"knit":1,`,
		`{"knit":1,"level":"info","msg":"truncated"`,
		`{"knit":1,"level":"info","msg":"x"} trailing`,
		`{"knit":1,"level":"info","msg":"x"}{"knit":1}`,
		`{"knit":1,"msg":"no level"}`,
		`{"knit":1,"level":"info"}`,
		`{"knit":1,"level":"loud","msg":"unknown level"}`,
		`{"knit":1,"level":3,"msg":"level not a string"}`,
		`{"knit":1,"level":"info","msg":7}`,
		`{"knit":1,"level":"info","msg":"x","ns":["a"]}`,
		`{"knit":1,"level":"info","msg":"x","t":1.5}`,
		`{"knit":1,"level":"info","msg":"x","t":"1ms"}`,
		`{"knit":1,"level":"info","msg":"x","lane":"0"}`,
		`{"knit":1,"level":"info","msg":"x","pid":99999999999999999999}`,
		`{"knit":1,"level":"info","msg":"x","extra":}`,
		`{"knit":1,"level":"info","msg":"x",}`,
		`{"knit":1,"level":"info","msg":"x","a":[1,}`,
		`{"knit":1,"level":"info","msg":"bad \x escape"}`,
	} {
		if e, ok := ParseLaneLine(line); ok {
			t.Errorf("ParseLaneLine(%q) = %+v, true; want false", line, e)
		}
	}
}

func TestLaneEntryEmit(t *testing.T) {
	cases := []struct {
		name      string
		line      string
		debug     string
		wantName  string
		wantLevel zapcore.Level
		written   bool
	}{
		{"info", `{"knit":1,"t":2000000,"level":"info","ns":"codec","msg":"m","lane":1,"incarnation":2,"pid":3,"k":"v","o":{"a":[1,true,null]}}`,
			"", "knit.codec", zapcore.InfoLevel, true},
		{"debug on", `{"knit":1,"t":2000000,"level":"debug","ns":"lifecycle","msg":"m","lane":1,"incarnation":2,"pid":3,"k":"v"}`,
			"lifecycle", "knit.lifecycle", zapcore.DebugLevel, true},
		{"debug off", `{"knit":1,"t":2000000,"level":"debug","ns":"lifecycle","msg":"m","lane":1,"incarnation":2,"pid":3,"k":"v"}`,
			"steal", "", 0, false},
		{"root", `{"knit":1,"t":2000000,"level":"warn","msg":"m","lane":1,"incarnation":2,"pid":3,"k":"v"}`,
			"", "knit", zapcore.WarnLevel, true},
		{"fatal is not fatal on the host", `{"knit":1,"t":2000000,"level":"fatal","ns":"lane","msg":"m","lane":1,"incarnation":2,"pid":3,"k":"v"}`,
			"", "knit.lane", zapcore.ErrorLevel, true},
		{"panic is not a panic on the host", `{"knit":1,"t":2000000,"level":"panic","ns":"lane","msg":"m","lane":1,"incarnation":2,"pid":3,"k":"v"}`,
			"", "knit.lane", zapcore.ErrorLevel, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, ok := ParseLaneLine(tc.line)
			if !ok {
				t.Fatalf("ParseLaneLine(%s) failed", tc.line)
			}
			obs, logs := observer.New(zapcore.DebugLevel)
			e.Emit(zap.New(filter(obs, ParseDebug(tc.debug))).Named(Root))
			if !tc.written {
				if logs.Len() != 0 {
					t.Fatalf("emitted %v, want nothing", logs.All())
				}
				return
			}
			if logs.Len() != 1 {
				t.Fatalf("%d entries emitted, want 1", logs.Len())
			}
			got := logs.All()[0]
			if got.LoggerName != tc.wantName || got.Level != tc.wantLevel || got.Message != "m" {
				t.Fatalf("emitted %s %v %q, want %s %v m", got.LoggerName, got.Level, got.Message, tc.wantName, tc.wantLevel)
			}
			m := got.ContextMap()
			for k, v := range map[string]any{"lane": int64(1), "incarnation": int64(2), "pid": int64(3), "lane_t": 2 * time.Millisecond, "k": "v"} {
				if m[k] != v {
					t.Errorf("field %s = %#v, want %#v (all: %v)", k, m[k], v, m)
				}
			}
		})
	}
}

// TestHostTimeline: the console line of a re-emitted entry carries lane_t.
func TestHostTimeline(t *testing.T) {
	lines := laneLines(t, "lifecycle", func(l *zap.Logger) { l.Named(Lifecycle).Debug("lane ready") })
	e, ok := ParseLaneLine(lines[0])
	if !ok {
		t.Fatalf("ParseLaneLine(%s) failed", lines[0])
	}
	var buf bytes.Buffer
	e.Emit(zap.New(NewCore(&buf, ParseDebug("lifecycle"))).Named(Root))
	out := buf.String()
	for _, want := range []string{"DEBUG", "knit.lifecycle", "lane ready", `"lane": 3`, `"incarnation": 7`, `"pid": 4242`, `"lane_t": "12.345ms"`} {
		if !strings.Contains(out, want) {
			t.Errorf("host line %q lacks %q", out, want)
		}
	}
}

// TestEmitHostileText: a lane's message and namespace cannot break a console line in two or
// reach the terminal as an escape sequence.
func TestEmitHostileText(t *testing.T) {
	line := `{"knit":1,"t":1,"level":"warn","ns":"x\n\u001b[2Jfake","msg":"one\nINFO\tforged line\u001b[31m","lane":0,"incarnation":0,"pid":1}`
	e, ok := ParseLaneLine(line)
	if !ok {
		t.Fatalf("ParseLaneLine(%s) failed", line)
	}
	var buf bytes.Buffer
	e.Emit(zap.New(NewCore(&buf, 0)).Named(Root))
	out := strings.TrimSuffix(buf.String(), "\n")
	if strings.ContainsAny(out, "\n\x1b") {
		t.Fatalf("console line carries raw control characters: %q", out)
	}
	for _, want := range []string{`one\nINFO forged line\x1b[31m`, `"ns": "x\\n\\x1b[2Jfake"`} {
		if !strings.Contains(out, want) {
			t.Errorf("console line %q lacks %q", out, want)
		}
	}
}
