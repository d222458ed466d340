package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"golang.org/x/sys/unix"
)

const inspectUsage = `Usage: knit inspect [-once] [-interval d] URL

Shows the pool behind a knit inspector (inspect.Handler) at URL, the address of its page:
every lane with its state, process, incarnation, calls in flight and in the backlog,
counters and memory, the pool's Stats fields such as per-task latency, and the latest
lifecycle transitions. On a terminal the view is redrawn in place as the pool changes,
until Ctrl-C or until the pool closes; otherwise (or with -once) one snapshot is printed.
`

// inspectView is what knit inspect shows: the inspector's snapshot, decoded loosely so
// that fields the pool's Stats gain later are shown too.
type inspectView struct {
	Pool   string
	Time   time.Time
	Stats  map[string]any
	Events []inspectEvent
	Missed uint64
	Final  bool

	order keyOrder // where each key first appears in the JSON: fields in their Go order
}

type inspectEvent struct {
	Seq         uint64
	Lane        int
	Incarnation int
	From, To    string
	Code        string
	Reason      string
	Delay       time.Duration
	Time        time.Time
}

func inspectCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, inspectUsage); fs.PrintDefaults() }
	once := fs.Bool("once", false, "print one snapshot and exit (the default when stdout is not a terminal)")
	interval := fs.Duration("interval", time.Second, "how often the live view refreshes when nothing happens")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	base, err := inspectorURL(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "knit inspect: %v\n", err)
		return 2
	}
	width, _, tty := terminalSize(stdout)
	if *once || !tty {
		v, err := fetchSnapshot(ctx, base)
		if err != nil {
			fmt.Fprintf(stderr, "knit inspect: %v\n", err)
			return 1
		}
		var t timeline
		t.add(v)
		_, _ = stdout.Write(renderView(v, &t, width, 0))
		return 0
	}
	if err := inspectLive(ctx, base, *interval, stdout, func() (int, int) {
		w, h, _ := terminalSize(stdout)
		return w, h
	}); err != nil {
		fmt.Fprintf(stderr, "knit inspect: %v\n", err)
		return 1
	}
	return 0
}

// inspectorURL is the inspector's base: the page's address, ending in a slash.
func inspectorURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%s: not an http URL", s)
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	u.RawQuery, u.Fragment = "", ""
	return u, nil
}

// terminalSize reports w's size if it is a terminal.
func terminalSize(w io.Writer) (width, height int, tty bool) {
	f, ok := w.(*os.File)
	if !ok {
		return 0, 0, false
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, 0, false
	}
	return int(ws.Col), int(ws.Row), true
}

func fetchSnapshot(ctx context.Context, base *url.URL) (*inspectView, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base.JoinPath("snapshot").String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", req.URL, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", req.URL, err)
	}
	v, err := decodeView(b)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", req.URL, err)
	}
	return v, nil
}

// inspectLive redraws the view in place on every message of the inspector's stream, until
// ctx ends (Ctrl-C) or the pool closes; a stream that breaks is opened again. It draws on
// the terminal's alternate screen and leaves the last view on the normal one.
func inspectLive(ctx context.Context, base *url.URL, interval time.Duration, out io.Writer, size func() (int, int)) error {
	stream := base.JoinPath("stream")
	stream.RawQuery = url.Values{"interval": {interval.String()}}.Encode()
	_, _ = io.WriteString(out, "\x1b[?1049h\x1b[?25l") // alternate screen, no cursor
	var last []byte
	defer func() {
		_, _ = io.WriteString(out, "\x1b[?25h\x1b[?1049l") // back to the normal screen
		_, _ = out.Write(last)
	}()
	var t timeline
	var lastID string
	for {
		final, err := readStream(ctx, stream.String(), &lastID, func(v *inspectView) {
			t.add(v)
			width, height := size()
			last = renderView(v, &t, width, height)
			var frame bytes.Buffer
			frame.WriteString("\x1b[H")
			for line := range strings.Lines(string(last)) {
				frame.WriteString(strings.TrimSuffix(line, "\n") + "\x1b[K\n")
			}
			frame.WriteString("\x1b[J")
			_, _ = out.Write(frame.Bytes())
		})
		switch {
		case final:
			return nil
		case ctx.Err() != nil:
			return nil // Ctrl-C
		case err == nil:
			continue // the server ended the stream, as it does every few seconds: on from lastID
		}
		_, _ = fmt.Fprintf(out, "\x1b[H\x1b[2J%s: %v; retrying\x1b[K\n", stream, err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}

// readStream reads server-sent events from u and hands each snapshot to draw; it reports
// whether the stream ended with the pool's final snapshot. It sends *lastID as Last-Event-ID
// (if any), to resume after it, and keeps the id of each message there. A stream the server
// ended cleanly returns a nil error: the inspector ends every stream after a few seconds,
// and a client reconnects at once.
func readStream(ctx context.Context, u string, lastID *string, draw func(*inspectView)) (final bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if *lastID != "" {
		req.Header.Set("Last-Event-ID", *lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, errors.New(resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20) // a snapshot is a few KiB a lane
	var data []byte
	var id string
	for sc.Scan() {
		line := bytes.TrimSuffix(sc.Bytes(), []byte("\r"))
		switch {
		case len(line) == 0 && len(data) > 0:
			v, err := decodeView(data)
			if err != nil {
				return false, err
			}
			data = data[:0]
			draw(v)
			if id != "" {
				*lastID = id
			}
			if v.Final {
				return true, nil
			}
		case bytes.HasPrefix(line, []byte("id: ")):
			id = string(line[len("id: "):])
		case bytes.HasPrefix(line, []byte("data: ")):
			data = append(data, line[len("data: "):]...)
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	if len(data) > 0 {
		return false, io.ErrUnexpectedEOF // cut in the middle of a message
	}
	return false, nil
}

// decodeView decodes a snapshot and notes the order of its keys.
func decodeView(b []byte) (*inspectView, error) {
	var v inspectView
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	v.order = keysInOrder(b)
	return &v, nil
}

// keyOrder ranks object keys by where they first appear in a JSON document. Decoded into
// maps, objects lose the order of their fields; ranked, Stats fields the command does not
// know keep the order Go gave them.
type keyOrder map[string]int

func keysInOrder(b []byte) keyOrder {
	o := keyOrder{}
	dec := json.NewDecoder(bytes.NewReader(b))
	// For each open container: is it an object, and is the next token in it a key?
	type level struct{ object, key bool }
	var stack []level
	for {
		tok, err := dec.Token()
		if err != nil {
			return o
		}
		top := len(stack) - 1
		if top >= 0 && stack[top].object && stack[top].key {
			if k, ok := tok.(string); ok {
				if _, seen := o[k]; !seen {
					o[k] = len(o)
				}
				stack[top].key = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, level{object: true, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, level{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
			top--
		}
		if top >= 0 && stack[top].object { // a value ended: a key comes next
			stack[top].key = true
		}
	}
}

// keys are m's keys in document order (unknown ones last, by name).
func (o keyOrder) keys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		ra, oka := o[a]
		rb, okb := o[b]
		switch {
		case oka && okb:
			return ra - rb
		case oka != okb:
			if oka {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return keys
}

// heading is a field name as a column heading: TotalCompleted → TOTAL COMPLETED.
func heading(k string) string {
	var b strings.Builder
	for i, r := range k {
		if i > 0 && unicode.IsUpper(r) && unicode.IsLower(rune(k[i-1])) {
			b.WriteByte(' ')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// timeline keeps the latest lifecycle events across snapshots.
type timeline struct {
	pool   string
	events []inspectEvent
}

const timelineKeep = 200

func (t *timeline) add(v *inspectView) {
	if v.Pool != t.pool {
		t.pool, t.events = v.Pool, nil
	}
	for _, e := range v.Events {
		if n := len(t.events); n == 0 || e.Seq > t.events[n-1].Seq {
			t.events = append(t.events, e)
		}
	}
	if n := len(t.events); n > timelineKeep {
		t.events = slices.Delete(t.events, 0, n-timelineKeep)
	}
}

var (
	knownLane   = []string{"Lane", "State", "PID", "Incarnation", "Restarts", "InFlight", "Queued", "Completed", "Failed", "RSS"}
	laneHeads   = []string{"LANE", "STATE", "PID", "INC", "RESTARTS", "IN FLIGHT", "BACKLOG", "COMPLETED", "FAILED", "RSS"}
	knownStats  = []string{"Runtime", "Lanes", "Closed", "Failed", "DroppedEvents", "Spares", "Host"}
	durationKey = regexp.MustCompile(`^(P\d+(\.\d+)?|Max|Min|Mean|Avg)$|(Latency|Duration|Wait|Run|Delay|Window)$`)
)

// renderView is the view as text: a header, the lanes, other Stats fields and, with
// height > 0, as many of the latest events as fit (else the last 20).
func renderView(v *inspectView, t *timeline, width, height int) []byte {
	var b bytes.Buffer
	s := v.Stats
	lanes := records(s["Lanes"])
	state := "live"
	switch {
	case v.Final:
		state = "closed"
	case s["Failed"] == true:
		state = "FAILED"
	}
	ready, restarts, inflight := 0, 0.0, 0.0
	for _, l := range lanes {
		if l["State"] == "ready" {
			ready++
		}
		restarts += num(l["Restarts"])
		inflight += num(l["InFlight"])
	}
	host, _ := s["Host"].(map[string]any)
	fmt.Fprintf(&b, "knit inspect  %s  [%s]  %s\n", v.Pool, state, v.Time.Local().Format("15:04:05"))
	fmt.Fprintf(&b, "runtime %v  lanes %d/%d ready  restarts %.0f  in flight %.0f  spares %d  dropped events %.0f  host pid %.0f %s\n\n",
		s["Runtime"], ready, len(lanes), restarts, inflight, len(records(s["Spares"])), num(s["DroppedEvents"]),
		num(host["PID"]), bytesText(num(host["RSS"])))

	cols := slices.Clone(knownLane)
	heads := slices.Clone(laneHeads)
	for _, l := range lanes {
		for _, k := range v.order.keys(l) {
			if !slices.Contains(cols, k) {
				cols, heads = append(cols, k), append(heads, heading(k))
			}
		}
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(heads, "\t")+"\t")
	for _, l := range lanes {
		cells := make([]string, len(cols))
		for i, c := range cols {
			switch c {
			case "RSS":
				cells[i] = bytesText(num(l[c]))
			case "PID":
				cells[i] = valueText(c, l[c])
				if cells[i] == "0" {
					cells[i] = "-"
				}
			default:
				cells[i] = valueText(c, l[c])
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	_ = tw.Flush()

	// Stats fields this command does not know, such as per-task latency.
	for _, name := range v.order.keys(s) {
		if slices.Contains(knownStats, name) {
			continue
		}
		fmt.Fprintf(&b, "\n%s\n", name)
		renderRecords(&b, v.order, s[name])
	}

	events := t.events
	keep := 20
	if height > 0 {
		keep = max(height-strings.Count(b.String(), "\n")-3, 3)
	}
	if len(events) > keep {
		events = events[len(events)-keep:]
	}
	fmt.Fprintf(&b, "\nlifecycle (latest %d)\n", len(events))
	for _, e := range slices.Backward(events) {
		who := fmt.Sprintf("lane %d inc %d", e.Lane, e.Incarnation)
		if e.Lane < 0 {
			who = "pool"
		}
		line := fmt.Sprintf("%s  %-12s %s → %s", e.Time.Local().Format("15:04:05.000"), who, e.From, e.To)
		if e.Code != "" {
			line += "  " + e.Code
		}
		if e.Reason != "" {
			line += "  " + e.Reason
		}
		if e.Delay > 0 {
			line += "  backoff " + e.Delay.String()
		}
		if width > 0 && len([]rune(line)) > width {
			line = string([]rune(line)[:width])
		}
		b.WriteString(line + "\n")
	}
	return b.Bytes()
}

// renderRecords writes a list or map of records as a table, anything else as a line.
func renderRecords(b *bytes.Buffer, order keyOrder, v any) {
	var rows []map[string]any
	switch x := v.(type) {
	case []any:
		rows = records(x)
	case map[string]any:
		for _, k := range order.keys(x) {
			r, ok := x[k].(map[string]any)
			if !ok {
				rows = []map[string]any{x}
				break
			}
			rows = append(rows, mergeName(k, r))
		}
	default:
		fmt.Fprintf(b, "  %s\n", valueText("", v))
		return
	}
	if len(rows) == 0 {
		b.WriteString("  none yet\n")
		return
	}
	var cols []string
	for _, r := range rows {
		for _, k := range order.keys(r) {
			if !slices.Contains(cols, k) {
				cols = append(cols, k)
			}
		}
	}
	if i := slices.Index(cols, "Name"); i > 0 { // a map's key first
		cols = append([]string{"Name"}, slices.Delete(cols, i, i+1)...)
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	heads := make([]string, len(cols))
	for i, c := range cols {
		heads[i] = heading(c)
	}
	fmt.Fprintln(tw, "  "+strings.Join(heads, "\t")+"\t")
	for _, r := range rows {
		cells := make([]string, len(cols))
		for i, c := range cols {
			cells[i] = valueText(c, r[c])
		}
		fmt.Fprintln(tw, "  "+strings.Join(cells, "\t")+"\t")
	}
	_ = tw.Flush()
}

func mergeName(k string, r map[string]any) map[string]any {
	m := map[string]any{"Name": k}
	for kk, vv := range r {
		m[kk] = vv
	}
	return m
}

func records(v any) []map[string]any {
	list, _ := v.([]any)
	rows := make([]map[string]any, 0, len(list))
	for _, x := range list {
		if r, ok := x.(map[string]any); ok {
			rows = append(rows, r)
		} else {
			rows = append(rows, map[string]any{"Value": x})
		}
	}
	return rows
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

func valueText(key string, v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case float64:
		if durationKey.MatchString(key) {
			return time.Duration(x).String()
		}
		if x == math.Trunc(x) && math.Abs(x) < 1e15 {
			return strconv.FormatInt(int64(x), 10)
		}
		return strconv.FormatFloat(x, 'g', 4, 64)
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

func bytesText(n float64) string {
	if n <= 0 {
		return "-"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// interruptible is ctx, ended by Ctrl-C or SIGTERM.
func interruptible(ctx context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}
