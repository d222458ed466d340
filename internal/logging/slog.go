package logging

import (
	"log/slog"
	"math"

	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// Slog returns an slog.Logger (for protoactor-go's actor system) that writes through l in
// the supervisor namespace: its logger name is l's name + ".supervisor". protoactor logs its
// routine events ("[ACTOR] Recovering", actor started, ...) at Info, so slog Info and below
// become zap Debug, shown only with KNIT_DEBUG=supervisor (or a base logger at Debug); slog
// Warn and Error stay Warn and Error. A nil l gives a logger that drops everything.
func Slog(l *zap.Logger) *slog.Logger {
	if l == nil {
		l = zap.NewNop()
	}
	name := Supervisor
	if l.Name() != "" {
		name = l.Name() + "." + Supervisor
	}
	return slog.New(zapslog.NewHandler(&demoteCore{l.Core()},
		zapslog.WithName(name),
		zapslog.AddStacktraceAt(slog.Level(math.MaxInt)), // protoactor's own stack says nothing useful
	))
}

// demoteCore turns Info entries into Debug ones.
type demoteCore struct{ zapcore.Core }

func demote(l zapcore.Level) zapcore.Level {
	if l == zapcore.InfoLevel {
		return zapcore.DebugLevel
	}
	return l
}

func (c *demoteCore) Enabled(l zapcore.Level) bool { return c.Core.Enabled(demote(l)) }

func (c *demoteCore) With(fields []zapcore.Field) zapcore.Core {
	return &demoteCore{c.Core.With(fields)}
}

func (c *demoteCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	ent.Level = demote(ent.Level)
	return c.Core.Check(ent, ce)
}
