package logging

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

// LaneMarker starts every JSON line a process lane logs, so that the host tells them from
// anything else the lane (or a task, or the Go runtime) writes to stderr. The whole line is
//
//	{"knit":1,"t":<ns since the host's epoch>,"level":"debug","ns":"lifecycle","msg":"...",
//	 "lane":0,"incarnation":1,"pid":123,<the entry's fields>...}
const LaneMarker = `{"knit":1,`

// LaneLogger returns the logger of a process lane: it writes one JSON object per line to w
// (the lane's stderr), starting with LaneMarker, carrying the lane, incarnation and pid and
// the entry's time as nanoseconds since epoch (the host's, from the boot record). Info and
// above always pass; Debug only for the namespaces in debug. It is named "knit" like the
// host's root logger: log through LaneLogger(...).Named(ns).
func LaneLogger(w io.Writer, lane, incarnation, pid int, epoch time.Time, debug Namespaces) *zap.Logger {
	cfg := zapcore.EncoderConfig{
		// "t" and the marker are written by laneEncoder itself.
		LevelKey:       "level",
		NameKey:        "ns",
		MessageKey:     "msg",
		LineEnding:     "\n",
		EncodeLevel:    zapcore.LowercaseLevelEncoder,
		EncodeTime:     zapcore.RFC3339NanoTimeEncoder, // time-valued fields only
		EncodeDuration: zapcore.StringDurationEncoder,
		EncodeName:     encodeNamespace,
	}
	enc := &laneEncoder{Encoder: zapcore.NewJSONEncoder(cfg), epoch: epoch}
	core := filter(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), zapcore.DebugLevel), debug)
	return zap.New(core).Named(Root).With(
		zap.Int("lane", lane), zap.Int("incarnation", incarnation), zap.Int("pid", pid))
}

// encodeNamespace writes a logger name as its namespace: "knit.lifecycle" as "lifecycle".
func encodeNamespace(name string, enc zapcore.PrimitiveArrayEncoder) {
	if name == Root {
		name = ""
	}
	enc.AppendString(strings.TrimPrefix(name, Root+"."))
}

var lanePool = buffer.NewPool()

// laneEncoder puts the marker and the time since the epoch in front of zap's JSON object.
type laneEncoder struct {
	zapcore.Encoder
	epoch time.Time
}

func (e *laneEncoder) Clone() zapcore.Encoder {
	return &laneEncoder{Encoder: e.Encoder.Clone(), epoch: e.epoch}
}

func (e *laneEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	inner, err := e.Encoder.EncodeEntry(ent, fields)
	if err != nil {
		return nil, err
	}
	defer inner.Free()
	out := lanePool.Get()
	out.AppendString(LaneMarker)
	out.AppendString(`"t":`)
	out.AppendInt(ent.Time.Sub(e.epoch).Nanoseconds())
	body := inner.Bytes()
	if len(body) > 0 && body[0] == '{' {
		body = body[1:]
	}
	if len(body) > 0 && body[0] != '}' {
		out.AppendByte(',')
	}
	_, _ = out.Write(body)
	return out, nil
}

// LaneEntry is one log entry a process lane wrote, as ParseLaneLine read it.
type LaneEntry struct {
	Level       zapcore.Level
	NS          string // namespace ("" for the lane's root logger)
	Message     string
	Time        time.Duration // since the host's epoch
	Lane        int
	Incarnation int
	PID         int
	Fields      []zap.Field // the entry's other fields, in the order the lane wrote them
}

// ParseLaneLine reads a line a lane wrote to stderr. It reports false, quickly, for a line
// that does not start with LaneMarker, and for anything malformed: such a line is logged
// as plain stderr text. It never panics, whatever the input.
func ParseLaneLine(line string) (LaneEntry, bool) {
	if !strings.HasPrefix(line, LaneMarker) {
		return LaneEntry{}, false
	}
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return LaneEntry{}, false
	}
	var e LaneEntry
	var seen uint8 // reserved keys read once; a repeat is an ordinary field
	const (
		sKnit = 1 << iota
		sT
		sLevel
		sNS
		sMsg
		sLane
		sInc
		sPID
	)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return LaneEntry{}, false
		}
		key, ok := t.(string)
		if !ok {
			return LaneEntry{}, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return LaneEntry{}, false
		}
		bit := uint8(0)
		switch key {
		case "knit":
			bit = sKnit
		case "t":
			bit = sT
		case "level":
			bit = sLevel
		case "ns":
			bit = sNS
		case "msg":
			bit = sMsg
		case "lane":
			bit = sLane
		case "incarnation":
			bit = sInc
		case "pid":
			bit = sPID
		}
		if bit == 0 || seen&bit != 0 {
			f, ok := rawField(key, raw)
			if !ok {
				return LaneEntry{}, false
			}
			e.Fields = append(e.Fields, f)
			continue
		}
		seen |= bit
		switch bit {
		case sKnit:
			if n, ok := rawInt(raw); !ok || n != 1 {
				return LaneEntry{}, false
			}
		case sT:
			n, ok := rawInt(raw)
			if !ok {
				return LaneEntry{}, false
			}
			e.Time = time.Duration(n)
		case sLevel:
			s, ok := rawString(raw)
			if !ok || e.Level.UnmarshalText([]byte(s)) != nil {
				return LaneEntry{}, false
			}
		case sNS:
			if e.NS, ok = rawString(raw); !ok {
				return LaneEntry{}, false
			}
		case sMsg:
			if e.Message, ok = rawString(raw); !ok {
				return LaneEntry{}, false
			}
		case sLane, sInc, sPID:
			n, ok := rawInt(raw)
			if !ok || int64(int(n)) != n {
				return LaneEntry{}, false
			}
			switch bit {
			case sLane:
				e.Lane = int(n)
			case sInc:
				e.Incarnation = int(n)
			default:
				e.PID = int(n)
			}
		}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return LaneEntry{}, false
	}
	if _, err := dec.Token(); err != io.EOF { // one object, and nothing after it
		return LaneEntry{}, false
	}
	if seen&(sLevel|sMsg) != sLevel|sMsg {
		return LaneEntry{}, false
	}
	return e, true
}

func rawString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	return s, json.Unmarshal(raw, &s) == nil
}

func rawInt(raw json.RawMessage) (int64, bool) {
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}

// rawField turns one JSON value into a zap field of the closest type.
func rawField(key string, raw json.RawMessage) (zap.Field, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return zap.Field{}, false
	}
	switch raw[0] {
	case '"':
		s, ok := rawString(raw)
		return zap.String(key, s), ok
	case 't', 'f':
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return zap.Field{}, false
		}
		return zap.Bool(key, b), true
	case 'n':
		return zap.Reflect(key, nil), string(raw) == "null"
	case '{', '[':
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		var v any
		if d.Decode(&v) != nil {
			return zap.Field{}, false
		}
		return zap.Reflect(key, v), true
	}
	if n, ok := rawInt(raw); ok {
		return zap.Int64(key, n), true
	}
	if n, err := strconv.ParseUint(string(raw), 10, 64); err == nil {
		return zap.Uint64(key, n), true
	}
	if !json.Valid(raw) {
		return zap.Field{}, false
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil { // valid JSON but out of float64's range
		return zap.String(key, string(raw)), true
	}
	return zap.Float64(key, f), true
}

// Emit re-logs the entry through l, the host's root logger (named "knit"), in the entry's
// namespace and at its level (DPanic, Panic and Fatal come in as Error: a lane must not
// panic or end the host), with lane, incarnation, pid, lane_t (the lane's time since the
// host's epoch, beside the host's own timestamp) and the lane's fields.
//
// The lane chose the message and the namespace: a console encoder writes both unescaped, so
// the message goes through Clean and a namespace that is not a plain name (letters, digits,
// '.', '_', '-', at most 32 bytes) is not used as one; it is kept, cleaned, as field "ns".
// Field values are escaped by every zap encoder.
func (e LaneEntry) Emit(l *zap.Logger) {
	var nsField []zap.Field
	switch {
	case plainName(e.NS):
		l = l.Named(e.NS)
	case e.NS != "":
		nsField = []zap.Field{zap.String("ns", Clean(e.NS, 64))}
	}
	lvl := e.Level
	if lvl > zapcore.ErrorLevel {
		lvl = zapcore.ErrorLevel
	}
	if lvl < zapcore.DebugLevel {
		lvl = zapcore.DebugLevel
	}
	ce := l.Check(lvl, Clean(e.Message, MaxLaneText))
	if ce == nil {
		return
	}
	fields := make([]zap.Field, 0, 5+len(e.Fields))
	fields = append(fields,
		zap.Int("lane", e.Lane), zap.Int("incarnation", e.Incarnation), zap.Int("pid", e.PID),
		zap.Duration("lane_t", e.Time))
	ce.Write(append(append(fields, nsField...), e.Fields...)...)
}

// MaxLaneText bounds one piece of text a lane chose (a message, a line) in the host's logs.
const MaxLaneText = 4096

// plainName reports whether ns can name a logger: a console encoder prints names raw.
func plainName(ns string) bool {
	if ns == "" || len(ns) > 32 {
		return false
	}
	for _, c := range []byte(ns) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
