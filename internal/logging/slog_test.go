package logging

import (
	"log/slog"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestSlogRouting(t *testing.T) {
	type want struct {
		written bool
		level   zapcore.Level
	}
	cases := []struct {
		debug string
		level slog.Level
		want  want
	}{
		{"", slog.LevelDebug, want{}},
		{"", slog.LevelInfo, want{}},
		{"", slog.LevelWarn, want{true, zapcore.WarnLevel}},
		{"", slog.LevelError, want{true, zapcore.ErrorLevel}},
		{"lifecycle", slog.LevelInfo, want{}}, // another namespace does not show the supervisor's
		{"supervisor", slog.LevelDebug, want{true, zapcore.DebugLevel}},
		{"supervisor", slog.LevelInfo, want{true, zapcore.DebugLevel}},
		{"supervisor", slog.LevelInfo + 2, want{true, zapcore.DebugLevel}},
		{"supervisor", slog.LevelWarn, want{true, zapcore.WarnLevel}},
		{"*", slog.LevelInfo, want{true, zapcore.DebugLevel}},
		{"*", slog.LevelError + 4, want{true, zapcore.ErrorLevel}},
	}
	for _, tc := range cases {
		t.Run(tc.debug+"/"+tc.level.String(), func(t *testing.T) {
			obs, logs := observer.New(zapcore.DebugLevel)
			root := zap.New(filter(obs, ParseDebug(tc.debug))).Named(Root).With(zap.String("pool", "p1"))
			sl := Slog(root).With("system", "actors")
			sl.Log(t.Context(), tc.level, "[ACTOR] Recovering", slog.String("pid", "lane-0"), slog.Int("n", 2))
			if !tc.want.written {
				if logs.Len() != 0 {
					t.Fatalf("written %v, want nothing", logs.All())
				}
				return
			}
			if logs.Len() != 1 {
				t.Fatalf("%d entries, want 1", logs.Len())
			}
			e := logs.All()[0]
			if e.Level != tc.want.level || e.LoggerName != "knit.supervisor" || e.Message != "[ACTOR] Recovering" {
				t.Fatalf("entry %v %s %q, want %v knit.supervisor", e.Level, e.LoggerName, e.Message, tc.want.level)
			}
			m := e.ContextMap()
			for k, v := range map[string]any{"pool": "p1", "system": "actors", "pid": "lane-0", "n": int64(2)} {
				if m[k] != v {
					t.Errorf("field %s = %#v, want %#v", k, m[k], v)
				}
			}
			if e.Stack != "" {
				t.Errorf("stack trace attached: %s", e.Stack)
			}
		})
	}
}

func TestSlogUserLoggerDecides(t *testing.T) {
	// A user's logger at Info: slog Info (now Debug) is dropped, Warn passes.
	obs, logs := observer.New(zapcore.InfoLevel)
	sl := Slog(New(zap.New(obs), 0))
	if sl.Enabled(t.Context(), slog.LevelInfo) {
		t.Error("slog Info enabled on an Info logger, want it demoted to Debug")
	}
	sl.Info("started")
	sl.Warn("mailbox full")
	if logs.Len() != 1 || logs.All()[0].Message != "mailbox full" {
		t.Fatalf("entries %v, want only the warning", logs.All())
	}
	Slog(nil).Error("dropped") // must not panic
}
