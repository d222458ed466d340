// Package logging holds knit's zap plumbing: the KNIT_DEBUG namespaces, the host logger that
// filters Debug entries by namespace, the bridge that routes protoactor's slog output into
// zap, and the JSON lines a process lane writes to stderr together with the host-side parser
// that re-emits them on the host's timeline.
//
// Loggers are named "knit.<namespace>" (knit.lifecycle, knit.fastpath, knit.steal,
// knit.supervisor, knit.codec, knit.lane): take the pool's root logger, which is named
// "knit", and call Named with one of the namespace constants. A Debug entry passes only
// when its namespace is on (KNIT_DEBUG, parsed by ParseDebug); Info and above always pass.
//
// What this package must never do: allocate, format or take a lock for an entry whose
// namespace is off. When no namespace is on, Core.Enabled(Debug) is false and zap drops a
// Debug entry at once; when some other namespace is on, the namespace check is a string
// comparison on the logger's name in Check, before any field is encoded.
//
// Callers on a hot path keep their side of that. l.Debug(msg) without fields is free, but
// l.Debug(msg, fields...) is not: Go builds the variadic []zap.Field on the heap (zap hands
// it to an interface) before zap looks at the level, one allocation even when the namespace
// is off. So a Debug entry with fields on a hot path goes through Debug (zap's Check):
//
//	if ce := logging.Debug(l, "claimed"); ce != nil {
//		ce.Write(zap.Int("slot", i), zap.Uint32("gen", gen))
//	}
//
// which builds its fields only when the entry will be written. Fields are zap.Field values
// (zap.Int, zap.String, ...), never fmt.Sprintf results.
package logging

import (
	"io"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The namespaces KNIT_DEBUG can turn on.
const (
	Lifecycle  = "lifecycle"
	Fastpath   = "fastpath"
	Steal      = "steal"
	Supervisor = "supervisor"
	Codec      = "codec"
	Lane       = "lane"
	Remote     = "remote"
)

// Root is the name of knit's root logger; a namespace logger is Root + "." + namespace.
const Root = "knit"

// EnvDebug is the environment variable that turns namespaces on.
const EnvDebug = "KNIT_DEBUG"

// Namespaces is a set of debug namespaces. The zero value has every namespace off.
type Namespaces uint8

const (
	nsLifecycle Namespaces = 1 << iota
	nsFastpath
	nsSteal
	nsSupervisor
	nsCodec
	nsLane
	nsRemote
	nsAll // "*": every namespace, and Debug entries of loggers outside any namespace
)

var nsNames = [...]struct {
	name string
	bit  Namespaces
}{
	{Lifecycle, nsLifecycle}, {Fastpath, nsFastpath}, {Steal, nsSteal},
	{Supervisor, nsSupervisor}, {Codec, nsCodec}, {Lane, nsLane}, {Remote, nsRemote},
}

// ParseDebug parses a KNIT_DEBUG value: namespace names separated by commas and/or white
// space, "*" for all of them. Unknown names are ignored; case does not matter.
func ParseDebug(s string) Namespaces {
	var n Namespaces
	for _, f := range strings.FieldsFunc(s, func(r rune) bool {
		return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r'
	}) {
		if f == "*" {
			n |= nsAll
			continue
		}
		n |= bitOf(strings.ToLower(f))
	}
	return n
}

// DebugFromEnv parses KNIT_DEBUG from the environment.
func DebugFromEnv() Namespaces { return ParseDebug(os.Getenv(EnvDebug)) }

func bitOf(ns string) Namespaces {
	switch ns {
	case Lifecycle:
		return nsLifecycle
	case Fastpath:
		return nsFastpath
	case Steal:
		return nsSteal
	case Supervisor:
		return nsSupervisor
	case Codec:
		return nsCodec
	case Lane:
		return nsLane
	}
	return 0
}

// Has reports whether namespace ns is on. With "*" every name is on, known or not.
func (n Namespaces) Has(ns string) bool {
	if n&nsAll != 0 {
		return true
	}
	return n&bitOf(ns) != 0
}

// Any reports whether some namespace is on.
func (n Namespaces) Any() bool { return n != 0 }

// String returns the set in ParseDebug's syntax ("*" when all are on).
func (n Namespaces) String() string {
	if n&nsAll != 0 {
		return "*"
	}
	var b strings.Builder
	for _, e := range nsNames {
		if n&e.bit != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(e.name)
		}
	}
	return b.String()
}

// namespaceOf returns the namespace of a logger name: "lifecycle" for "knit.lifecycle" and
// "knit.lifecycle.anything", "" for "knit" and for names outside knit. It never allocates.
func namespaceOf(name string) string {
	if len(name) <= len(Root)+1 || name[:len(Root)] != Root || name[len(Root)] != '.' {
		return ""
	}
	ns := name[len(Root)+1:]
	if i := strings.IndexByte(ns, '.'); i >= 0 {
		ns = ns[:i]
	}
	return ns
}

// nsCore passes Info and above to its inner core and Debug (and below) only for loggers in
// an enabled namespace.
type nsCore struct {
	zapcore.Core
	debug Namespaces
}

// filter wraps core so that its Debug entries pass only for enabled namespaces.
func filter(core zapcore.Core, debug Namespaces) zapcore.Core {
	return &nsCore{Core: core, debug: debug}
}

func (c *nsCore) Enabled(l zapcore.Level) bool {
	if l < zapcore.InfoLevel && !c.debug.Any() {
		return false
	}
	return c.Core.Enabled(l)
}

func (c *nsCore) With(fields []zapcore.Field) zapcore.Core {
	return &nsCore{Core: c.Core.With(fields), debug: c.debug}
}

func (c *nsCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if ent.Level < zapcore.InfoLevel && !c.debug.Has(namespaceOf(ent.LoggerName)) {
		return ce
	}
	return c.Core.Check(ent, ce)
}

// NewCore returns the core of New's default logger writing to w: zap's development
// (console) encoding, Info and above always, Debug for the namespaces in debug.
func NewCore(w io.Writer, debug Namespaces) zapcore.Core {
	enc := zap.NewDevelopmentEncoderConfig()
	inner := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), zapcore.DebugLevel)
	return filter(inner, debug)
}

// New returns knit's root logger, named "knit". With a nil base it writes to stderr through
// NewCore (Info and above, Debug for the namespaces in debug). A non-nil base (Config.Logger)
// decides levels and destination itself; it is only named, unless its name ends in "knit"
// already (logger.Named("knit") stays knit, not knit.knit).
//
// Log through New(...).Named(ns) with ns one of the namespace constants.
func New(base *zap.Logger, debug Namespaces) *zap.Logger {
	if base != nil {
		if n := base.Name(); n == Root || strings.HasSuffix(n, "."+Root) {
			return base
		}
		return base.Named(Root)
	}
	return zap.New(NewCore(os.Stderr, debug)).Named(Root)
}

// Debug returns the checked Debug entry for msg on l, or nil when l's namespace (or level)
// is off: write the fields through it, so that they are built only when the entry is
// written. It is l.Check(zapcore.DebugLevel, msg) and allocates nothing when off.
func Debug(l *zap.Logger, msg string) *zapcore.CheckedEntry {
	return l.Check(zapcore.DebugLevel, msg)
}
