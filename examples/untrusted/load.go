package main

import (
	"bytes"
	"compress/zlib"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/knitgo/knit"
)

// loadOptions describe a load run.
type loadOptions struct {
	Service     options
	Clients     int
	Requests    int
	Poison      float64  // fraction of requests that are poison for the process lanes
	MatchPoison float64  // fraction that are a never-advancing /match (goroutine lanes)
	Kinds       []string // poison kinds, sent in turn (default: crash, exit, alloc, spin)
	Seed        int64
}

// Poison kinds for the process lanes. alloc alternates between a template calling hog and
// a PNG decompression bomb; it is left out when the lanes have no memory limit.
var allKinds = []string{"crash", "exit", "alloc", "spin"}

// request is one prepared HTTP request.
type request struct {
	endpoint string // render, thumb, match
	poison   string // "" for a clean request, else its kind
	path     string
	ctype    string
	body     []byte
}

// result is what became of one request.
type result struct {
	req    *request
	status int    // 0: no answer (the client gave up, or the connection failed)
	code   string // X-Knit-Code of an error answer
	lane   string // X-Knit-Lane of an error answer
	msg    string
	err    error
	at     time.Duration // when it was sent, from the start of the run
	lat    time.Duration
}

// report is a load run's figures.
type report struct {
	opts    loadOptions
	limits  knit.LimitMechanism
	wall    time.Duration
	results []result
	// From the process pool's events and Stats.
	laneEnds        map[knit.Code]int // ends of lane incarnations the host did not ask for, by code
	restarts        int               // restart decisions (restarting or crash_loop_backoff events)
	crashLoopEvents int               // events into crash_loop_backoff
	crashLoopLanes  map[int]bool      // lanes that were ever in crash_loop_backoff
	crashLoopAtEnd  int               // lanes in crash_loop_backoff when the load ended
	statsRestarts   int               // sum of LaneStats.Restarts when the load ended
	droppedEvents   uint64
}

// runLoad starts the service on a loopback port, sends it opts.Requests requests from
// opts.Clients concurrent clients, and reports what they got.
func runLoad(opts loadOptions) (*report, error) {
	if opts.Clients < 1 || opts.Requests < 1 {
		return nil, errors.New("need at least one client and one request")
	}
	if opts.Kinds == nil {
		opts.Kinds = allKinds
	}
	for _, k := range opts.Kinds {
		if !slices.Contains(allKinds, k) {
			return nil, fmt.Errorf("unknown poison kind %q (known: %s)", k, strings.Join(allKinds, ", "))
		}
	}
	if opts.Service.Memory <= 0 { // never allocate without bound on an unlimited lane
		opts.Kinds = slices.DeleteFunc(slices.Clone(opts.Kinds), func(k string) bool { return k == "alloc" })
	}
	reqs := plan(opts)

	svc, err := newService(opts.Service)
	if err != nil {
		return nil, err
	}
	rep := &report{opts: opts, limits: svc.proc.Stats().Limits, laneEnds: map[knit.Code]int{},
		crashLoopLanes: map[int]bool{}}
	events := svc.proc.Events()
	eventsDone := make(chan struct{})
	go func() {
		defer close(eventsDone)
		for e := range events {
			switch e.To {
			case knit.StateCrashed, knit.StateExited, knit.StateStartupFailed:
				rep.laneEnds[e.Code]++
			case knit.StateRestarting:
				rep.restarts++
			case knit.StateCrashLoopBackoff:
				rep.restarts++
				rep.crashLoopEvents++
				rep.crashLoopLanes[e.Lane] = true
			}
		}
	}()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = svc.close(context.Background())
		return nil, err
	}
	srv := &http.Server{Handler: svc.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	base := "http://" + ln.Addr().String()

	// A request with no answer 10s past its deadline has hung.
	tr := &http.Transport{MaxIdleConnsPerHost: opts.Clients, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: opts.Service.Deadline + 10*time.Second}
	rep.results = make([]result, len(reqs))
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range opts.Clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(reqs) {
					return
				}
				rep.results[i] = send(client, base, &reqs[i], start)
			}
		})
	}
	wg.Wait()
	rep.wall = time.Since(start)

	st := svc.proc.Stats()
	for _, l := range st.Lanes {
		rep.statsRestarts += l.Restarts
		if l.State == knit.StateCrashLoopBackoff {
			rep.crashLoopAtEnd++
		}
	}
	rep.droppedEvents = st.DroppedEvents

	tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = errors.Join(srv.Shutdown(ctx), svc.close(ctx))
	<-eventsDone
	return rep, err
}

func send(c *http.Client, base string, r *request, start time.Time) result {
	res := result{req: r, at: time.Since(start)}
	t0 := time.Now()
	resp, err := c.Post(base+r.path, r.ctype, bytes.NewReader(r.body))
	if err != nil {
		res.err, res.lat = err, time.Since(t0)
		return res
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	res.lat = time.Since(t0)
	if err != nil {
		res.err = err
		return res
	}
	res.status, res.code, res.lane = resp.StatusCode, resp.Header.Get("X-Knit-Code"), resp.Header.Get("X-Knit-Lane")
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		_ = json.Unmarshal(body, &e)
		res.msg = e.Error
	}
	return res
}

// plan lays out the run's requests: clean ones 40 % /render, 30 % /thumb, 30 % /match;
// poison ones in turn through opts.Kinds.
func plan(opts loadOptions) []request {
	rng := rand.New(rand.NewPCG(uint64(opts.Seed), 30))
	clean := cleanRequests()
	reqs := make([]request, opts.Requests)
	poisoned := 0
	for i := range reqs {
		x := rng.Float64()
		switch {
		case x < opts.Poison && len(opts.Kinds) > 0:
			k := opts.Kinds[poisoned%len(opts.Kinds)]
			reqs[i] = poisonRequest(k, poisoned/len(opts.Kinds))
			poisoned++
		case x < opts.Poison+opts.MatchPoison:
			reqs[i] = jsonRequest("match", "match-loop", "/match", MatchIn{Pattern: `x*`, Text: "y" + strings.Repeat("x", 10)})
		default:
			y := rng.Float64()
			var pick []request
			switch {
			case y < 0.4:
				pick = clean["render"]
			case y < 0.7:
				pick = clean["thumb"]
			default:
				pick = clean["match"]
			}
			reqs[i] = pick[rng.IntN(len(pick))]
		}
	}
	return reqs
}

func jsonRequest(endpoint, poison, path string, v any) request {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return request{endpoint: endpoint, poison: poison, path: path, ctype: "application/json", body: b}
}

func poisonRequest(kind string, n int) request {
	if !slices.Contains(allKinds, kind) {
		panic("unknown poison kind " + kind)
	}
	tpl := func(call string) request {
		return jsonRequest("render", kind, "/render", RenderIn{
			Template: "Dear {{.Name}}, {{" + call + "}}", Data: Page{Name: "mallory"}})
	}
	switch kind {
	case "crash":
		return tpl("crash")
	case "exit":
		return tpl("exit")
	case "alloc":
		if n%2 == 0 {
			return tpl("hog")
		}
		return request{endpoint: "thumb", poison: "alloc", path: "/thumb?w=64", ctype: "image/png", body: bomb()}
	}
	return tpl("spin")
}

// cleanRequests are the well-formed requests the clean traffic picks from, by endpoint.
func cleanRequests() map[string][]request {
	templates := []string{
		`<h1>{{.Title}}</h1><p>Hello, {{.Name | upper}}!</p><ul>{{range .Items}}<li>{{.}}</li>{{end}}</ul>`,
		`{{.Name}} has {{.Count}} item{{if ne .Count 1}}s{{end}}: {{join .Items ", "}}.`,
		`{{range $i, $x := .Items}}{{$i}}={{printf "%q" $x}};{{end}} -- {{.Title | printf "%.10s"}}`,
	}
	pages := []Page{
		{Title: "Orders", Name: "alice", Items: []string{"wool", "needles", "pattern"}, Count: 3},
		{Title: "A rather long title for a page", Name: "bob", Items: []string{"yarn"}, Count: 1},
		{Title: "Empty", Name: "carol", Count: 0},
	}
	m := map[string][]request{}
	for _, t := range templates {
		for _, p := range pages {
			m["render"] = append(m["render"], jsonRequest("render", "", "/render", RenderIn{Template: t, Data: p}))
		}
	}
	for i, size := range []image.Point{{320, 240}, {200, 200}, {640, 120}} {
		for _, w := range []int{32, 64, 96} {
			m["thumb"] = append(m["thumb"], request{endpoint: "thumb", path: fmt.Sprintf("/thumb?w=%d", w),
				ctype: "image/png", body: picture(size, uint64(i))})
		}
	}
	text := strings.Repeat("Knitting is looping yarn; call 555-0100 or 555-0199 before Friday. "+
		"Purling, casting and binding are the rest of it. Knit Pools serve Sally Jones and Bob Smith. ", 12)
	for _, p := range []string{`\b[a-z]+ing\b`, `\d{3}-\d{4}`, `(?i)knit\w*`, `[A-Z][a-z]+ [A-Z][a-z]+`} {
		m["match"] = append(m["match"], jsonRequest("match", "", "/match", MatchIn{Pattern: p, Text: text}))
	}
	return m
}

// picture is a PNG of the given size: gradients with some noise.
func picture(size image.Point, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	img := image.NewNRGBA(image.Rectangle{Max: size})
	for y := range size.Y {
		for x := range size.X {
			n := uint8(rng.IntN(16))
			img.SetNRGBA(x, y, color.NRGBA{R: uint8(x) + n, G: uint8(y) + n, B: uint8(x+y) ^ n, A: 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		panic(err)
	}
	return b.Bytes()
}

var bomb = sync.OnceValue(func() []byte { return bombPNG(20000) })

// bombPNG is a valid PNG header for a side×side 8-bit grey image (400 MB decoded for
// 20000) whose pixels are all zero, so it compresses to well under a megabyte.
func bombPNG(side int) []byte {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13) // width, height, bit depth 8, colour type 0 (grey), 0, 0, 0
	binary.BigEndian.PutUint32(ihdr[0:], uint32(side))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(side))
	ihdr[8] = 8
	chunk(&b, "IHDR", ihdr)
	var z bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&z, zlib.BestSpeed)
	row := make([]byte, side+1) // filter byte 0, then the row
	for range side {
		_, _ = zw.Write(row)
	}
	_ = zw.Close()
	chunk(&b, "IDAT", z.Bytes())
	chunk(&b, "IEND", nil)
	return b.Bytes()
}

func chunk(b *bytes.Buffer, typ string, data []byte) {
	_ = binary.Write(b, binary.BigEndian, uint32(len(data)))
	crc := crc32.NewIEEE()
	_, _ = crc.Write([]byte(typ))
	_, _ = crc.Write(data)
	b.WriteString(typ)
	b.Write(data)
	_ = binary.Write(b, binary.BigEndian, crc.Sum32())
}

// Figures of a report.

func (r *report) clean() (n, ok int) {
	for _, x := range r.results {
		if x.req.poison == "" {
			n++
			if x.status == http.StatusOK {
				ok++
			}
		}
	}
	return n, ok
}

// unanswered counts the requests that got no HTTP answer.
func (r *report) unanswered() int {
	n := 0
	for _, x := range r.results {
		if x.status == 0 {
			n++
		}
	}
	return n
}

func quantile(lats []time.Duration, q float64) time.Duration {
	if len(lats) == 0 {
		return 0
	}
	return lats[min(len(lats)-1, int(q*float64(len(lats))))]
}

func latencies(rs []result, keep func(result) bool) []time.Duration {
	var out []time.Duration
	for _, x := range rs {
		if keep(x) {
			out = append(out, x.lat)
		}
	}
	slices.Sort(out)
	return out
}

func (r *report) print(w io.Writer) {
	o := r.opts
	policy := "default"
	if o.Service.CountCallDeaths {
		policy = "CountCallDeaths"
	}
	kinds := map[string]int{}
	for _, x := range r.results {
		if x.req.poison != "" {
			kinds[x.req.poison]++
		}
	}
	fmt.Fprintf(w, "untrusted: %d requests, %d clients, poison %.2g (%s), match-poison %.2g, restart policy %s, memory %d MiB (%s)\n",
		o.Requests, o.Clients, o.Poison, counts(kinds), o.MatchPoison, policy, o.Service.Memory>>20, r.limits)
	all := latencies(r.results, func(result) bool { return true })
	fmt.Fprintf(w, "  throughput  %.0f req/s (%d in %.2fs)\n", float64(len(r.results))/r.wall.Seconds(), len(r.results), r.wall.Seconds())
	fmt.Fprintf(w, "  latency     p50 %s  p99 %s  max %s (all requests)\n", round(quantile(all, .5)), round(quantile(all, .99)), round(quantile(all, 1)))
	cl := latencies(r.results, func(x result) bool { return x.req.poison == "" })
	fmt.Fprintf(w, "              p50 %s  p99 %s  max %s (clean requests)\n", round(quantile(cl, .5)), round(quantile(cl, .99)), round(quantile(cl, 1)))
	n, ok := r.clean()
	fmt.Fprintf(w, "  clean       %d of %d ok: %.3f %%\n", ok, n, 100*float64(ok)/float64(max(n, 1)))

	// Clean failures by endpoint, status and code, with when they happened.
	type key struct {
		endpoint string
		status   int
		code     string
	}
	type agg struct {
		n           int
		first, last time.Duration
		msg         string
	}
	fails := map[key]*agg{}
	for _, x := range r.results {
		if x.req.poison != "" || x.status == http.StatusOK {
			continue
		}
		k := key{x.req.endpoint, x.status, x.code}
		if x.status == 0 {
			k.code = "no answer"
			x.msg = x.err.Error()
		}
		a := fails[k]
		if a == nil {
			a = &agg{first: x.at, msg: x.msg}
			fails[k] = a
		}
		a.n++
		a.last = x.at
	}
	keys := make([]key, 0, len(fails))
	for k := range fails {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return fails[keys[i]].n > fails[keys[j]].n })
	for _, k := range keys {
		a := fails[k]
		fmt.Fprintf(w, "    clean failure  /%s %d %s ×%d, from %.1fs to %.1fs: %s\n",
			k.endpoint, k.status, k.code, a.n, a.first.Seconds(), a.last.Seconds(), trim(a.msg, 160))
	}
	poison := map[string]int{}
	for _, x := range r.results {
		if x.req.poison != "" {
			c := x.code
			if x.status == 0 {
				c = "no answer"
			}
			poison[fmt.Sprintf("%s→%d %s", x.req.poison, x.status, c)]++
		}
	}
	if len(poison) > 0 {
		fmt.Fprintf(w, "  poison      %s\n", counts(poison))
	}
	fmt.Fprintf(w, "  unanswered  %d (no HTTP answer within deadline+10s)\n", r.unanswered())
	ends := map[string]int{}
	for c, k := range r.laneEnds {
		ends[string(c)] = k
	}
	fmt.Fprintf(w, "  lanes       ends %s; restarts %d (events), %d (Stats)\n", counts(ends), r.restarts, r.statsRestarts)
	fmt.Fprintf(w, "              crash_loop_backoff: %d events, %d lanes ever, %d lanes at the end; dropped events %d\n",
		r.crashLoopEvents, len(r.crashLoopLanes), r.crashLoopAtEnd, r.droppedEvents)
}

// list prints every poison request and every clean failure, in the order they were sent.
func (r *report) list(w io.Writer) {
	rs := slices.Clone(r.results)
	slices.SortStableFunc(rs, func(a, b result) int { return int(a.at - b.at) })
	for _, x := range rs {
		if x.req.poison == "" && x.status == http.StatusOK {
			continue
		}
		what := "clean"
		if x.req.poison != "" {
			what = "poison " + x.req.poison
		}
		msg := x.msg
		if x.err != nil {
			msg = x.err.Error()
		}
		lane := x.lane
		if lane == "" {
			lane = "-"
		}
		fmt.Fprintf(w, "%8.3fs +%-8s /%-6s %-13s lane %s %d %s %s\n", x.at.Seconds(), round(x.lat), x.req.endpoint, what, lane, x.status, x.code, trim(msg, 100))
	}
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

func trim(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
