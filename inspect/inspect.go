// Package inspect serves a knit pool's live inspector over HTTP: an HTML page that updates
// itself over server-sent events, and the JSON it is drawn from, as net/http/pprof serves a
// program's profiles. It reads only what knit's public API offers (Stats, RecentEvents,
// LastEvent, Config) and /proc: an optional part of an operator's toolbox, kept out of the
// package every knit program imports.
//
// It must never hold a lock of the pool while it writes to a client, nor change the pool.
package inspect

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/internal/procfs"
)

// Handler returns an http.Handler that shows p live, as net/http/pprof shows a program:
// an HTML page that updates itself over server-sent events, and the JSON it is drawn from.
// Mount it under a prefix of your choice:
//
//	mux.Handle("/debug/knit/", http.StripPrefix("/debug/knit", inspect.Handler(pool)))
//
// It serves, relative to where it is mounted:
//
//	/          the page: every lane (state, pid, incarnation, calls in flight and in the
//	           backlog, counters, memory), Stats fields such as per-task latency, and a
//	           timeline of lifecycle transitions with their codes and reasons
//	/stats     Stats as JSON, its lanes with their processes' resident memory (RSS)
//	/lanes     the lanes alone
//	/events    the pool's recent lifecycle events (the last 256), ?since=N for those after N
//	/config    the pool's configuration, without its logger, actor system or callbacks,
//	           and with its secrets redacted (see RevealSecrets)
//	/snapshot  stats and events in one JSON object: one message of the stream
//	/stream    server-sent events: a snapshot at once, then on every lifecycle event and
//	           every ?interval (default 1s, at least 100ms); each message's id is the
//	           number of the last event it carries, and a stream opened with Last-Event-ID
//	           (or ?since=N) carries only the events after it
//
// The inspector reads what Stats reads and the events the supervisor emits; it never holds
// a lock of the pool while it writes to a client.
//
// A stream lasts at most 10s. Its write deadline is set once, when it opens, so a client
// that stops reading holds it 10s at most, however much of the stream the kernels' socket
// buffers absorb (megabytes: they would hold a stream of one message a second for many
// minutes). Shortly before the deadline the server ends the stream; its first message asks
// the client to reconnect at once ("retry: 250"), and an EventSource does, sending
// Last-Event-ID, so that a reader that keeps reading sees one unbroken stream. A stream also
// ends when its client goes away and when the pool is closed (after a last snapshot).
//
// At most 64 streams run at once. One more does not wait and is not refused: it ends the
// oldest stream (which is at most 10s old, and reconnects if its client still reads), so
// that clients that stopped reading, or too many pages left open, never lock an operator
// out. The JSON endpoints are never refused. An http.Server's Shutdown waits for streams to
// end (10s at most): close the pool first to end them at once, or use Server.Close.
//
// The inspector shows task names, pids, error reasons and configuration: serve it only
// where operators, not the public, can reach it. /config redacts what may be secret: the
// values of Process.Env (it shows their names), and the values of environment assignments
// (NAME=value, and bwrap's --setenv NAME value) in Process.Prefix, such as the TOKEN of
// {"env", "TOKEN=...", ...}. Handler(p, RevealSecrets()) shows them.
func Handler(p *knit.Pool, opts ...Option) http.Handler {
	if p == nil {
		panic("inspect.Handler: nil pool")
	}
	in := &inspector{p: p, name: p.Name()}
	for _, o := range opts {
		o(in)
	}
	return in
}

// An Option changes what a Handler serves.
type Option func(*inspector)

// RevealSecrets makes /config show Process.Env and Process.Prefix as they are, secrets
// included. Any client that reaches the inspector can then read them.
func RevealSecrets() Option { return func(in *inspector) { in.reveal = true } }

//go:embed ui/inspector.html
var inspectorPage []byte

const (
	inspectMaxStreams  = 64
	inspectRetry       = 250 * time.Millisecond // how soon a client reconnects to a stream that ended
	inspectInterval    = time.Second
	inspectMinInterval = 100 * time.Millisecond
	inspectMaxInterval = time.Minute
	inspectMinGap      = 50 * time.Millisecond  // between two messages of a stream
	inspectStatsMaxAge = 100 * time.Millisecond // a snapshot of Stats serves streams this long
)

// inspectWriteTimeout is a stream's life: its write deadline, set when it opens. A variable
// for tests.
var inspectWriteTimeout = 10 * time.Second

// inspectEndMargin is how long before its deadline a stream ends itself: a write that
// starts after it might not finish in time.
const inspectEndMargin = 500 * time.Millisecond

type inspector struct {
	p      *knit.Pool
	name   string
	reveal bool // RevealSecrets

	smu     sync.Mutex
	streams []*streamSlot // the open streams, oldest first
	// started and ended, when set, are told of every stream that opens and every one that
	// ends (tests).
	started, ended func()

	mu       sync.Mutex
	stats    json.RawMessage // the last Stats snapshot, encoded
	statsAt  time.Time       // when it was taken
	statsSeq uint64          // the last event added before it was taken
}

// inspectStats is Stats as the inspector serves it: the whole value, so that fields added
// to Stats show up by themselves, with memory added to the lanes and the host.
type inspectStats struct {
	knit.Stats
	Lanes []inspectLane // shadows Stats.Lanes
	Host  inspectProcess
}

// inspectLane is a lane's LaneStats and, for a process lane, its resident memory.
type inspectLane struct {
	knit.LaneStats
	RSS int64 `json:",omitempty"` // bytes, from /proc/<pid>/statm
}

type inspectProcess struct {
	PID int
	RSS int64 `json:",omitempty"`
}

// inspectSnapshot is one message of the stream.
type inspectSnapshot struct {
	Pool   string
	Time   time.Time
	Stats  json.RawMessage
	Events []knit.NumberedEvent
	Missed uint64 `json:",omitempty"` // events after the requested one the ring no longer holds
	Final  bool   `json:",omitempty"` // the pool is closed: the stream ends with this message
}

func (in *inspector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	path := r.URL.Path
	if path == "" {
		// Mounted with StripPrefix at "/x" and asked for "/x": the page's relative links
		// need "/x/". (Mounted with StripPrefix("/"), the page itself comes as "".)
		page, _, _ := strings.Cut(r.RequestURI, "?")
		if strings.HasPrefix(page, "/") && !strings.HasPrefix(page, "//") && !strings.HasSuffix(page, "/") {
			http.Redirect(w, r, page+"/"+queryOf(r), http.StatusMovedPermanently)
			return
		}
		path = "/"
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	switch strings.TrimPrefix(path, "/") {
	case "":
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		_, _ = w.Write(inspectorPage)
	case "stats":
		seq, _ := in.p.LastEvent()
		writeJSON(w, json.RawMessage(in.statsJSON(seq)))
	case "lanes":
		writeJSON(w, in.lanes(in.p.Stats()))
	case "events":
		since, err := parseSince(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		events, missed := in.p.RecentEvents(since)
		writeJSON(w, struct {
			Events []knit.NumberedEvent
			Missed uint64 `json:",omitempty"`
		}{nonNil(events), missed})
	case "config":
		writeJSON(w, configView(in.p.Config(), in.reveal))
	case "snapshot":
		since, err := parseSince(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		snap, _ := in.snapshot(since, isClosed(in.p.Closed()))
		writeJSON(w, snap)
	case "stream":
		in.stream(w, r)
	default:
		http.NotFound(w, r)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func queryOf(r *http.Request) string {
	if r.URL.RawQuery == "" {
		return ""
	}
	return "?" + r.URL.RawQuery
}

func parseSince(r *http.Request) (uint64, error) {
	s := r.URL.Query().Get("since")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("since: %w", err)
	}
	return n, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

func nonNil(e []knit.NumberedEvent) []knit.NumberedEvent {
	if e == nil {
		return []knit.NumberedEvent{}
	}
	return e
}

// lanes adds memory to the lanes of s.
func (in *inspector) lanes(s knit.Stats) []inspectLane {
	lanes := make([]inspectLane, len(s.Lanes))
	for i, l := range s.Lanes {
		lanes[i].LaneStats = l
		if l.PID > 0 {
			lanes[i].RSS, _ = procfs.RSS(l.PID) // a lane that just ended has none
		}
	}
	return lanes
}

// statsJSON is the pool's Stats, encoded, taken afresh unless a snapshot younger than
// inspectStatsMaxAge saw every event up to seq: however many streams are open, Stats runs
// at most about ten times a second, plus once per burst of events.
func (in *inspector) statsJSON(seq uint64) json.RawMessage {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.stats != nil && in.statsSeq >= seq && time.Since(in.statsAt) < inspectStatsMaxAge {
		return in.stats
	}
	seq, _ = in.p.LastEvent() // before Stats: a later event makes this snapshot stale
	s := in.p.Stats()
	host := inspectProcess{PID: os.Getpid()}
	host.RSS, _ = procfs.RSS(host.PID)
	b, err := json.Marshal(inspectStats{Stats: s, Lanes: in.lanes(s), Host: host})
	if err != nil { // Stats holds nothing json cannot encode; say so rather than panic
		b, _ = json.Marshal(map[string]string{"Error": err.Error()})
	}
	in.stats, in.statsAt, in.statsSeq = b, time.Now(), seq
	return b
}

// snapshot is the stats and the events after since; it returns the number of the last
// event it carries (since, if none).
func (in *inspector) snapshot(since uint64, final bool) (inspectSnapshot, uint64) {
	events, missed := in.p.RecentEvents(since)
	last := since
	if n := len(events); n > 0 {
		last = events[n-1].Seq
	}
	return inspectSnapshot{Pool: in.name, Time: time.Now(), Stats: in.statsJSON(last),
		Events: nonNil(events), Missed: missed, Final: final}, last
}

// streamSlot is one open stream, as the others see it: one that opens when all slots are
// taken ends the oldest.
type streamSlot struct {
	opened time.Time
	evict  chan struct{} // closed when a newer stream takes the slot

	mu   sync.Mutex
	rc   *http.ResponseController
	done bool // the stream's handler is leaving: its deadline is no longer anyone else's
}

// open takes a slot for a stream, ending the oldest stream if every slot is taken.
func (in *inspector) open(rc *http.ResponseController) *streamSlot {
	s := &streamSlot{opened: time.Now(), evict: make(chan struct{}), rc: rc}
	in.smu.Lock()
	var oldest *streamSlot
	if len(in.streams) >= inspectMaxStreams {
		oldest = in.streams[0]
		in.streams = in.streams[1:]
	}
	in.streams = append(in.streams, s)
	started := in.started
	in.smu.Unlock()
	if oldest != nil {
		oldest.end()
	}
	if started != nil {
		started()
	}
	return s
}

// release gives s's slot back, if a newer stream has not taken it.
func (in *inspector) release(s *streamSlot) {
	in.smu.Lock()
	defer in.smu.Unlock()
	for i, o := range in.streams {
		if o == s {
			in.streams = append(in.streams[:i], in.streams[i+1:]...)
			return
		}
	}
}

// end ends the stream at once: between messages it sees evict; a write it is blocked in
// fails at the deadline end moves to now.
func (s *streamSlot) end() {
	close(s.evict)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		_ = s.rc.SetWriteDeadline(time.Now())
	}
}

// leave clears the stream's deadline, so that a connection the client reuses does not keep
// it; after leave, end no longer touches the deadline.
func (s *streamSlot) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	_ = s.rc.SetWriteDeadline(time.Time{})
}

// stream serves server-sent events until the client goes away or stops reading, the pool
// is closed, a newer stream takes its slot, or its life (inspectWriteTimeout) is nearly
// over. Every message is a fresh snapshot: a slow client gets fewer of them, never a queue;
// nothing of the pool is locked while a message is written.
func (in *inspector) stream(w http.ResponseWriter, r *http.Request) {
	interval := inspectInterval
	if s := r.URL.Query().Get("interval"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			http.Error(w, "interval: "+err.Error(), http.StatusBadRequest)
			return
		}
		interval = min(max(d, inspectMinInterval), inspectMaxInterval)
	}
	seq, err := parseSince(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if id, err := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64); err == nil {
		seq = id // an EventSource reconnecting: on from where it was
	}
	if last, _ := in.p.LastEvent(); seq > last {
		seq = 0 // an id this pool has not reached: the client saw another pool
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no") // proxies that buffer would hold the stream back
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	rc := http.NewResponseController(w)
	// One deadline for the whole stream: a deadline renewed at every write would never
	// pass while the socket buffers absorb what the client does not read.
	deadline := time.Now().Add(inspectWriteTimeout)
	_ = rc.SetWriteDeadline(deadline) // unsupported: the stream still ends at its life's end
	if in.ended != nil {
		defer in.ended() // last: the slot is given back by then
	}
	slot := in.open(rc)
	defer in.release(slot)
	defer slot.leave()
	w.WriteHeader(http.StatusOK)

	life := time.NewTimer(time.Until(deadline) - inspectEndMargin)
	defer life.Stop()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var gap *time.Timer
	defer func() {
		if gap != nil {
			gap.Stop()
		}
	}()
	retry := fmt.Sprintf("retry: %d\n", inspectRetry.Milliseconds())
	for {
		_, changed := in.p.LastEvent() // before the snapshot: no event falls between
		final := isClosed(in.p.Closed())
		var snap inspectSnapshot
		snap, seq = in.snapshot(seq, final)
		sent := time.Now()
		if err := writeEvent(rc, w, retry, seq, snap); err != nil {
			return // the client went away or stopped reading
		}
		retry = ""
		if final {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-slot.evict:
			return
		case <-life.C:
			return // the client reconnects (retry) with Last-Event-ID
		case <-in.p.Closed():
		case <-tick.C:
		case <-changed:
			// Lifecycle events come in bursts (crashed, restarting, booting, ready): let
			// the burst finish rather than send a message per event.
			if wait := inspectMinGap - time.Since(sent); wait > 0 {
				if gap == nil {
					gap = time.NewTimer(wait)
				} else {
					gap.Reset(wait)
				}
				select {
				case <-r.Context().Done():
					return
				case <-slot.evict:
					return
				case <-gap.C:
				}
			}
		}
	}
}

var errNoFlush = errors.New("knit inspector: the response cannot be flushed")

// writeEvent writes one server-sent event, after the retry field if any, and flushes it,
// within the stream's deadline.
func writeEvent(rc *http.ResponseController, w http.ResponseWriter, retry string, id uint64, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// A JSON encoding holds no newline, so it is one data line.
	if _, err := fmt.Fprintf(w, "%sid: %d\ndata: %s\n\n", retry, id, b); err != nil {
		return err
	}
	if err := rc.Flush(); err != nil {
		if errors.Is(err, http.ErrNotSupported) {
			return errNoFlush
		}
		return err
	}
	return nil
}

// inspectConfig is what the inspector shows of a Config: the effective values (defaults
// filled in), durations as text, and nothing that is code, a handle or possibly a secret —
// no logger, actor system, parent or callback; of Process.Env only the names, and
// Process.Prefix with the values of its environment assignments redacted (unless
// RevealSecrets).
type inspectConfig struct {
	Lanes            int
	Runtime          knit.Runtime
	Balancer         string
	Backlog          int
	BlockWhenFull    bool
	LaneSpin         string
	CallerSpin       string
	Payload          knit.Payload
	PanicCrashesLane bool
	Restart          inspectRestart
	FailFast         bool
	StopAckTimeout   string
	KillGrace        string
	StartupTimeout   string
	Liveness         string
	EventBuffer      int
	Process          *inspectProcessConfig `json:",omitempty"` // process lanes only
	Logger           string                // "default" or "custom"
	ActorSystem      string                // "own" or "shared"
	Parent           string                `json:",omitempty"`
	OnEvent          bool                  // a callback is set
}

type inspectRestart struct {
	Type, Strategy, OnIntensity    string
	MaxRestarts                    int
	Period                         string
	BackoffMin, BackoffMax         string
	BackoffJitter                  float64
	BackoffReset, CrashLoopBackoff string
}

type inspectProcessConfig struct {
	Command      []string // empty: this executable
	Prefix       []string `json:",omitempty"` // environment assignments redacted
	Env          []string `json:",omitempty"` // names only
	SharedMemory string
	Spares       int
}

func configView(c knit.Config, reveal bool) inspectConfig {
	rp := c.Restart.WithDefaults()
	v := inspectConfig{
		Lanes: c.Lanes, Runtime: c.Runtime, Balancer: c.Balancer.String(),
		Backlog: c.Backlog, BlockWhenFull: c.BlockWhenFull,
		LaneSpin: c.LaneSpin.String(), CallerSpin: c.CallerSpin.String(), Payload: c.Payload,
		PanicCrashesLane: c.PanicCrashesLane, FailFast: c.FailFast,
		Restart: inspectRestart{
			Type: rp.Type.String(), Strategy: rp.Strategy.String(), OnIntensity: rp.OnIntensity.String(),
			MaxRestarts: rp.MaxRestarts, Period: rp.Period.String(),
			BackoffMin: rp.Backoff.Min.String(), BackoffMax: rp.Backoff.Max.String(), BackoffJitter: rp.Backoff.Jitter,
			BackoffReset: rp.Backoff.Reset.String(), CrashLoopBackoff: rp.Backoff.CrashLoopMax.String(),
		},
		StopAckTimeout: c.StopAckTimeout.String(), KillGrace: c.KillGrace.String(),
		StartupTimeout: c.StartupTimeout.String(), Liveness: c.Liveness.String(),
		EventBuffer: c.EventBuffer, Logger: "default", ActorSystem: "own", OnEvent: c.OnEvent != nil,
	}
	if c.Liveness < 0 {
		v.Liveness = "off"
	}
	if c.Logger != nil {
		v.Logger = "custom"
	}
	if c.ActorSystem != nil {
		v.ActorSystem = "shared"
	}
	if c.Parent != nil {
		v.Parent = c.Parent.String()
	}
	if c.Runtime == knit.Process {
		pc := &inspectProcessConfig{Command: c.Process.Command, Prefix: c.Process.Prefix, Env: c.Process.Env,
			SharedMemory: c.Process.SharedMemory.String(), Spares: c.Process.Spares}
		if !reveal {
			pc.Prefix = redactPrefix(c.Process.Prefix)
			pc.Env = nil
			for _, e := range c.Process.Env {
				name, _, _ := strings.Cut(e, "=")
				pc.Env = append(pc.Env, name)
			}
		}
		v.Process = pc
	}
	return v
}

// redacted replaces a secret's value in /config.
const redacted = "[redacted]"

// assignment matches an environment assignment NAME=value inside an argument: at its start,
// after white space (a shell command: sh -c "TOKEN=... exec lane") or after another = (an
// option: systemd-run --setenv=TOKEN=...). The value runs to white space; quoted, to its
// closing quote.
var assignment = regexp.MustCompile(`(^|[\s=])([A-Za-z_][A-Za-z0-9_]*)=('[^']*'?|"[^"]*"?|[^\s'"]*)`)

// redactPrefix is prefix with the values of its environment assignments redacted: those of
// env, sudo, docker -e, systemd-run --setenv and a shell's NAME=value words, and bwrap's
// --setenv NAME value. A wrapper that takes a secret another way shows it: put secrets in
// Process.Env, whose values /config never shows.
func redactPrefix(prefix []string) []string {
	if prefix == nil {
		return nil
	}
	out := make([]string, len(prefix))
	for i, a := range prefix {
		if i >= 2 && prefix[i-2] == "--setenv" { // bwrap --setenv NAME value
			out[i] = redacted
			continue
		}
		out[i] = assignment.ReplaceAllString(a, "${1}${2}="+redacted)
	}
	return out
}
