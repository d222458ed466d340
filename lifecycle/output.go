package lifecycle

import (
	"bytes"
	"io"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/knitgo/knit/internal/logging"
)

// Output relays a lane process's stdout and stderr to the host's logger, line by line, and
// keeps what a crash report needs: the last stderr lines and the Go runtime's account of a
// crash (CrashReport).
//
// A lane must never wait for the host's log sink: a sink that blocks (a full pipe nobody
// reads, a slow remote writer) would block the lane's writes to its stderr, then the lane,
// its calls and Close. So the lines the pipe readers split are handed to a relay goroutine
// through a bounded queue; the pipes are always drained, and a line that finds the queue
// full is dropped and counted. The relay reports drops ("lane output: lines dropped") as
// soon as the sink takes a line again, and once more when the output ends. Crash
// bookkeeping happens before the queue: it never loses a line.
type Output struct {
	root    *zap.Logger // the host's root logger: the lane's own JSON log lines
	queue   chan outLine
	relayed chan struct{} // closed when the relay goroutine has ended
	dropped atomic.Uint64 // lines dropped, in all
	pending atomic.Uint64 // lines dropped and not reported yet

	mu    sync.Mutex
	log   *zap.Logger // with the lane's fields: plain lines
	lines []string    // ring of the last tailKeep stderr lines
	next  int
	full  bool
	crash CrashReport
}

// outLine is one line waiting for the relay: a plain line (with the logger and level it goes
// to) or one of the lane's own log entries.
type outLine struct {
	log    *zap.Logger
	level  zapcore.Level
	msg    string
	line   string
	entry  logging.LaneEntry
	parsed bool
}

const (
	tailKeep = 64
	// outQueue is how many lines may wait for a slow sink, per lane process: with lines
	// cut at logging.MaxLaneText, at most 2 MiB.
	outQueue = 512
)

// NewOutput starts the relay of one lane process's output to root (plain lines go to its
// lane namespace, with the lane's index); Close ends it.
func NewOutput(root *zap.Logger, lane int) *Output {
	o := &Output{root: root, lines: make([]string, tailKeep),
		queue: make(chan outLine, outQueue), relayed: make(chan struct{})}
	o.Relabel(lane)
	go o.relay()
	return o
}

// Relabel names the lane the output belongs to (a spare learns it when it is taken; -1 until
// then).
func (o *Output) Relabel(lane int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.log = o.root.Named(logging.Lane).With(zap.Int("lane", lane))
}

// Writer is the process's stdout (or stderr): it splits what the lane writes into lines and
// never blocks on the logger. One writer serves one pipe reader.
func (o *Output) Writer(stderr bool) io.Writer { return &lineWriter{out: o, stderr: stderr} }

// line takes one line from a pipe reader. It never blocks on the logger.
func (o *Output) line(s string, stderr bool) {
	if e, ok := logging.ParseLaneLine(s); ok {
		// The lane's own log line, re-emitted on the host's timeline. It stays out of the
		// crash tail: the lane prints what matters there in plain text too.
		o.enqueue(outLine{entry: e, parsed: true})
		return
	}
	raw := s
	s = logging.Clean(s, logging.MaxLaneText)
	o.mu.Lock()
	log := o.log
	if !stderr {
		o.mu.Unlock()
		o.enqueue(outLine{log: log, level: zapcore.InfoLevel, msg: "lane stdout", line: s})
		return
	}
	o.lines[o.next] = s
	o.next = (o.next + 1) % tailKeep
	o.full = o.full || o.next == 0
	// The goroutine dump after a panic or fatal error is a hundred lines of little use in
	// the console: the crash error carries the faulting goroutine's frames; the dump goes
	// to Debug. The report reads the raw line (its frames' file lines start with a tab);
	// Classify cleans what it keeps.
	level := zapcore.WarnLevel
	if o.crash.Line(raw) {
		level = zapcore.DebugLevel
	}
	o.mu.Unlock()
	o.enqueue(outLine{log: log, level: level, msg: "lane stderr", line: s})
}

func (o *Output) enqueue(l outLine) {
	select {
	case o.queue <- l:
	default:
		o.dropped.Add(1)
		o.pending.Add(1)
	}
}

// relay logs the queued lines until the output ends (Close), then reports drops still
// unreported.
func (o *Output) relay() {
	defer close(o.relayed)
	for l := range o.queue {
		switch {
		case l.parsed:
			l.entry.Emit(o.root)
		default:
			if ce := l.log.Check(l.level, l.msg); ce != nil {
				ce.Write(zap.String("line", l.line))
			}
		}
		o.reportDrops()
	}
	o.reportDrops()
}

func (o *Output) reportDrops() {
	if n := o.pending.Swap(0); n > 0 {
		o.mu.Lock()
		log := o.log
		o.mu.Unlock()
		log.Warn("lane output: lines dropped: the log sink is too slow", zap.Uint64("dropped", n),
			zap.Uint64("dropped_total", o.dropped.Load()))
	}
}

// Close ends the relay once the pipe readers are done (the process has been waited for).
// It does not wait for the relay: a sink that blocks keeps only the relay goroutine.
func (o *Output) Close() { close(o.queue) }

// Report returns the last stderr lines, the runtime's failure line and its crash account.
func (o *Output) Report() (tail []string, failure string, crash []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.full {
		tail = append([]string(nil), o.lines[:o.next]...)
	} else {
		tail = append(append([]string(nil), o.lines[o.next:]...), o.lines[:o.next]...)
	}
	return tail, o.crash.Failure(), o.crash.Crash()
}

// lineWriter splits what a lane writes into lines.
type lineWriter struct {
	out    *Output
	stderr bool
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	// Only the new bytes are searched: a lane writing a long line a byte at a time costs
	// the host linear time, not quadratic.
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf = append(w.buf, p...)
			break
		}
		w.buf = append(w.buf, p[:i]...)
		w.out.line(string(w.buf), w.stderr)
		w.buf, p = w.buf[:0], p[i+1:]
	}
	for len(w.buf) >= maxLine { // an endless line is still logged, in pieces
		w.out.line(string(w.buf[:maxLine]), w.stderr)
		w.buf = append(w.buf[:0], w.buf[maxLine:]...)
	}
	return n, nil
}

// maxLine is the longest piece of a line the relay takes at once.
const maxLine = 64 << 10
