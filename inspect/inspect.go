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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
//	/config    the pool's configuration, without its logger, actor system, callbacks or
//	           the values of Process.Env
//	/snapshot  stats and events in one JSON object: one message of the stream
//	/stream    server-sent events: a snapshot at once, then on every lifecycle event and
//	           every ?interval (default 1s, at least 100ms)
//
// The inspector reads what Stats reads and the events the supervisor emits; it never holds
// a lock of the pool while it writes to a client. A stream ends when its client goes away
// and when the pool is closed (after a last snapshot); a client that stops reading for 10s
// is dropped. At most 64 streams run at once. An http.Server's Shutdown waits for streams
// to end: close the pool first, or use Server.Close.
//
// The inspector shows task names, pids, error reasons and configuration: serve it only
// where operators, not the public, can reach it.
func Handler(p *knit.Pool) http.Handler {
	if p == nil {
		panic("inspect.Handler: nil pool")
	}
	return &inspector{p: p, name: p.Name()}
}

//go:embed ui/inspector.html
var inspectorPage []byte

const (
	inspectMaxStreams  = 64
	inspectInterval    = time.Second
	inspectMinInterval = 100 * time.Millisecond
	inspectMaxInterval = time.Minute
	inspectMinGap      = 50 * time.Millisecond  // between two messages of a stream
	inspectStatsMaxAge = 100 * time.Millisecond // a snapshot of Stats serves streams this long
)

// inspectWriteTimeout bounds each write of a stream: a client that reads nothing for it is
// dropped. A variable for tests.
var inspectWriteTimeout = 10 * time.Second

type inspector struct {
	p       *knit.Pool
	name    string
	streams atomic.Int32

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
		writeJSON(w, configView(in.p.Config()))
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

// stream serves server-sent events until the client goes away, stops reading, or the pool
// is closed. Every message is a fresh snapshot: a slow client gets fewer of them, never a
// queue; nothing of the pool is locked while a message is written.
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
	if in.streams.Add(1) > inspectMaxStreams {
		in.streams.Add(-1)
		http.Error(w, "too many inspector streams", http.StatusServiceUnavailable)
		return
	}
	defer in.streams.Add(-1)
	rc := http.NewResponseController(w)
	// A connection the browser reuses must not keep the last message's deadline.
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no") // proxies that buffer would hold the stream back
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}

	tick := time.NewTicker(interval)
	defer tick.Stop()
	var gap *time.Timer
	defer func() {
		if gap != nil {
			gap.Stop()
		}
	}()
	var seq uint64
	for {
		_, changed := in.p.LastEvent() // before the snapshot: no event falls between
		final := isClosed(in.p.Closed())
		var snap inspectSnapshot
		snap, seq = in.snapshot(seq, final)
		sent := time.Now()
		if err := writeEvent(rc, w, seq, snap); err != nil {
			return // the client went away or stopped reading
		}
		if final {
			return
		}
		select {
		case <-r.Context().Done():
			return
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
				case <-gap.C:
				}
			}
		}
	}
}

var errNoFlush = errors.New("knit inspector: the response cannot be flushed")

// writeEvent writes one server-sent event and flushes it, within inspectWriteTimeout.
func writeEvent(rc *http.ResponseController, w http.ResponseWriter, id uint64, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_ = rc.SetWriteDeadline(time.Now().Add(inspectWriteTimeout)) // unsupported: write without
	// A JSON encoding holds no newline, so it is one data line.
	if _, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", id, b); err != nil {
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
// no logger, actor system, parent or callback, and of Process.Env only the names.
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
	Prefix       []string `json:",omitempty"`
	Env          []string `json:",omitempty"` // names only
	SharedMemory string
	Spares       int
}

var balancerNames = [...]string{"least-loaded", "round-robin", "first-idle", "random", "first-idle-or-random"}

func configView(c knit.Config) inspectConfig {
	rp := c.Restart.WithDefaults()
	v := inspectConfig{
		Lanes: c.Lanes, Runtime: c.Runtime, Balancer: fmt.Sprintf("balancer(%d)", int(c.Balancer)),
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
	if int(c.Balancer) >= 0 && int(c.Balancer) < len(balancerNames) {
		v.Balancer = balancerNames[c.Balancer]
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
		pc := &inspectProcessConfig{Command: c.Process.Command, Prefix: c.Process.Prefix,
			SharedMemory: c.Process.SharedMemory.String(), Spares: c.Process.Spares}
		for _, e := range c.Process.Env {
			name, _, _ := strings.Cut(e, "=")
			pc.Env = append(pc.Env, name)
		}
		v.Process = pc
	}
	return v
}
