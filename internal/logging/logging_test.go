package logging

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestParseDebug(t *testing.T) {
	cases := []struct {
		in   string
		on   []string
		off  []string
		text string
	}{
		{"", nil, []string{Lifecycle, Fastpath, Steal, Supervisor, Codec, Lane, ""}, ""},
		{"lifecycle", []string{Lifecycle}, []string{Fastpath, Supervisor, ""}, "lifecycle"},
		{"lifecycle,steal", []string{Lifecycle, Steal}, []string{Codec}, "lifecycle,steal"},
		{" codec  lane\t", []string{Codec, Lane}, []string{Lifecycle}, "codec,lane"},
		{"fastpath, supervisor,,", []string{Fastpath, Supervisor}, []string{Steal}, "fastpath,supervisor"},
		{"LifeCycle", []string{Lifecycle}, []string{Steal}, "lifecycle"},
		{"bogus,steal,nope", []string{Steal}, []string{"bogus", "nope", Lifecycle}, "steal"},
		{"*", []string{Lifecycle, Fastpath, Steal, Supervisor, Codec, Lane, "", "other"}, nil, "*"},
		{"lane,*", []string{Lifecycle, Lane}, nil, "*"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			n := ParseDebug(tc.in)
			for _, ns := range tc.on {
				if !n.Has(ns) {
					t.Errorf("Has(%q) = false, want true", ns)
				}
			}
			for _, ns := range tc.off {
				if n.Has(ns) {
					t.Errorf("Has(%q) = true, want false", ns)
				}
			}
			if n.Any() != (len(tc.on) > 0) {
				t.Errorf("Any() = %v", n.Any())
			}
			if n.String() != tc.text {
				t.Errorf("String() = %q, want %q", n.String(), tc.text)
			}
		})
	}
}

func TestNamespaceOf(t *testing.T) {
	for name, want := range map[string]string{
		"":                     "",
		"knit":                 "",
		"knit.":                "",
		"knitting.lifecycle":   "",
		"other.lifecycle":      "",
		"knit.lifecycle":       "lifecycle",
		"knit.lifecycle.lane3": "lifecycle",
		"knit.supervisor":      "supervisor",
	} {
		if got := namespaceOf(name); got != want {
			t.Errorf("namespaceOf(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestNamespaceFiltering(t *testing.T) {
	type entry struct {
		ns    string // "" logs through the root logger
		level zapcore.Level
		msg   string
	}
	all := []entry{
		{Lifecycle, zapcore.DebugLevel, "lifecycle debug"},
		{Fastpath, zapcore.DebugLevel, "fastpath debug"},
		{Supervisor, zapcore.DebugLevel, "supervisor debug"},
		{"", zapcore.DebugLevel, "root debug"},
		{Steal, zapcore.InfoLevel, "steal info"},
		{Codec, zapcore.WarnLevel, "codec warn"},
		{"", zapcore.ErrorLevel, "root error"},
	}
	always := []string{"steal info", "codec warn", "root error"}
	cases := []struct {
		debug string
		want  []string // besides always
	}{
		{"", nil},
		{"lifecycle", []string{"lifecycle debug"}},
		{"fastpath,supervisor", []string{"fastpath debug", "supervisor debug"}},
		{"steal,codec", nil},
		{"*", []string{"lifecycle debug", "fastpath debug", "supervisor debug", "root debug"}},
	}
	for _, tc := range cases {
		t.Run(tc.debug, func(t *testing.T) {
			var buf bytes.Buffer
			root := zap.New(NewCore(&buf, ParseDebug(tc.debug))).Named(Root)
			for _, e := range all {
				l := root
				if e.ns != "" {
					l = root.Named(e.ns)
				}
				l.Log(e.level, e.msg, zap.Int("n", 1))
			}
			out := buf.String()
			want := append(append([]string(nil), always...), tc.want...)
			for _, e := range all {
				if got, exp := strings.Contains(out, e.msg), contains(want, e.msg); got != exp {
					t.Errorf("%q written: %v, want %v\n%s", e.msg, got, exp, out)
				}
			}
			if lines := strings.Count(out, "\n"); lines != len(want) {
				t.Errorf("%d lines, want %d:\n%s", lines, len(want), out)
			}
			if tc.debug == "lifecycle" && !strings.Contains(out, "knit.lifecycle") {
				t.Errorf("logger name missing:\n%s", out)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestNewWithBase(t *testing.T) {
	var buf bytes.Buffer
	enc := zap.NewDevelopmentEncoderConfig()
	base := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(&buf), zapcore.DebugLevel))
	// The base decides levels: KNIT_DEBUG does not filter a user's logger.
	l := New(base, 0)
	if l.Name() != Root {
		t.Fatalf("name %q, want %q", l.Name(), Root)
	}
	l.Named(Steal).Debug("steal debug")
	if !strings.Contains(buf.String(), "knit.steal\tsteal debug") {
		t.Fatalf("base logger output: %q", buf.String())
	}
	if New(nil, 0).Name() != Root {
		t.Fatal("default logger not named knit")
	}
}

// TestDebugOffDoesNotAllocate: a Debug entry with fields costs no allocation when its
// namespace is off, both when every namespace is off and when only others are on. Fields go
// through Debug's checked entry: l.Debug(msg, fields...) would heap-allocate its variadic
// slice before zap sees the level (see the package doc).
func TestDebugOffDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("allocation counts are only meaningful without -race and -cover")
	}
	cases := []struct {
		name string
		core zapcore.Core
	}{
		{"KNIT_DEBUG off", NewCore(&bytes.Buffer{}, 0)},
		{"other namespace on", NewCore(&bytes.Buffer{}, ParseDebug("lifecycle,steal"))},
		{"lane logger, other namespace on", LaneLogger(&bytes.Buffer{}, 0, 1, 2, epoch0, ParseDebug("lifecycle")).Core()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := zap.New(tc.core).Named(Root).Named(Fastpath)
			n, s := 7, "slot"
			written := 0
			allocs := testing.AllocsPerRun(1000, func() {
				if ce := Debug(l, "claimed"); ce != nil {
					written++
					ce.Write(zap.Int("slot", n), zap.String("what", s), zap.Uint32("gen", 3), zap.Bool("steal", true))
				}
				l.Debug("no fields")
			})
			if allocs != 0 || written != 0 {
				t.Fatalf("%v allocs per disabled Debug entry (%d written), want 0", allocs, written)
			}
		})
	}
	on := zap.New(NewCore(&bytes.Buffer{}, ParseDebug(Fastpath))).Named(Root).Named(Fastpath)
	if Debug(on, "claimed") == nil {
		t.Fatal("Debug returned nil for an enabled namespace")
	}
}
