// Untrusted is an HTTP service that runs what its clients send — text/template templates,
// PNG images, regular expressions — on knit pools with the default Config: templates and
// thumbnails on 4 process lanes limited to 256 MiB each, regexps on goroutine lanes. Some
// inputs are poison: they crash their lane from a goroutine, call os.Exit, allocate without
// bound or loop forever. The service answers every request, with an HTTP status mapped from
// knit's error codes, and serves the clean ones on.
//
// Serve it:
//
//	go run ./examples/untrusted -addr 127.0.0.1:8080
//	curl -s -d '{"template":"Hello, {{.Name | upper}}!","data":{"name":"knit"}}' 127.0.0.1:8080/render
//
// Or load it over loopback and see what became of the clean requests (load.go):
//
//	go run ./examples/untrusted -load -clients 50 -requests 20000 -poison 0.01
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/png"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/knitgo/knit"
)

// Page is the data a template renders.
type Page struct {
	Title string   `json:"title"`
	Name  string   `json:"name"`
	Items []string `json:"items"`
	Count int      `json:"count"`
}

// RenderIn is a /render request: a template and its data.
type RenderIn struct {
	Template string `json:"template"`
	Data     Page   `json:"data"`
}

// ThumbIn is a /thumb request: a PNG and the thumbnail's width.
type ThumbIn struct {
	PNG   []byte
	Width int
}

// MatchIn is a /match request: a regexp and the text it runs over.
type MatchIn struct {
	Pattern string `json:"pattern"`
	Text    string `json:"text"`
}

const (
	maxOutput  = 1 << 20 // bytes a template may write
	maxMatches = 1000
	maxBody    = 4 << 20 // the default Payload.MaxCall: the arena of a process lane
)

// helpers are the functions templates may call. The last four stand in for the bugs that
// untrusted input finds in real code: each does to its lane what such a bug would.
var helpers = template.FuncMap{
	"upper": strings.ToUpper,
	"join":  strings.Join,
	"crash": crash, // a nil dereference in a goroutine: the lane process dies (SIGSEGV → Go panic)
	"exit":  exit,  // os.Exit in a library: the lane exits
	"hog":   hog,   // an allocation without bound: the lane reaches its memory limit
	"spin":  spin,  // for {}: only HardTimeout ends it, by killing the lane
}

var nilPage *Page

func crash() string {
	done := make(chan struct{})
	go func() {
		nilPage.Count++ // nobody recovers a goroutine's panic: the process dies
		close(done)
	}()
	<-done
	return ""
}

func exit() string {
	os.Exit(3)
	return ""
}

func hog() string {
	var keep [][]byte
	for {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1 // touch every page, so that a cgroup counts it
		}
		keep = append(keep, b)
	}
}

func spin() string {
	for {
	}
}

var (
	// render runs a client's template over its data. A template that does not parse or
	// fails to execute is the client's mistake (TASK_ERROR, 400).
	render = knit.Define("untrusted.render", func(_ context.Context, in RenderIn) (string, error) {
		t, err := template.New("user").Funcs(helpers).Parse(in.Template)
		if err != nil {
			return "", err
		}
		var b strings.Builder
		if err := t.Execute(&limitWriter{w: &b, left: maxOutput}, in.Data); err != nil {
			return "", err
		}
		return b.String(), nil
	}, knit.HardTimeout(2*time.Second))

	// thumb decodes a PNG and scales it to a thumbnail. It decodes what it is given as
	// image/png does, without checking the dimensions first: a small file that declares a
	// huge image (a decompression bomb) takes the lane to its memory limit.
	thumb = knit.Define("untrusted.thumb", func(_ context.Context, in ThumbIn) ([]byte, error) {
		src, err := png.Decode(bytes.NewReader(in.PNG))
		if err != nil {
			return nil, err
		}
		var out bytes.Buffer
		if err := png.Encode(&out, scale(src, in.Width)); err != nil {
			return nil, err
		}
		return out.Bytes(), nil
	}, knit.HardTimeout(2*time.Second))

	// match returns the non-empty matches of a client's regexp, in order. Its loop has the
	// classic bug: it advances by the end of each match, so a pattern that matches the empty
	// string at the current position (x* before a y) never advances. It checks its context on
	// every turn, so the task's Timeout ends it; a goroutine lane cannot be killed, so a task
	// on one must always do that.
	match = knit.Define("untrusted.match", func(ctx context.Context, in MatchIn) ([]string, error) {
		re, err := regexp.Compile(in.Pattern)
		if err != nil {
			return nil, err
		}
		var out []string
		for pos := 0; pos < len(in.Text) && len(out) < maxMatches; {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			loc := re.FindStringIndex(in.Text[pos:])
			if loc == nil {
				break
			}
			if loc[1] > loc[0] {
				out = append(out, in.Text[pos+loc[0]:pos+loc[1]])
			}
			pos += loc[1]
		}
		return out, nil
	}, knit.Timeout(2*time.Second))
)

// limitWriter fails a write past its budget.
type limitWriter struct {
	w    io.Writer
	left int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if len(p) > l.left {
		return 0, fmt.Errorf("template output over %d bytes", maxOutput)
	}
	l.left -= len(p)
	return l.w.Write(p)
}

// scale is a nearest-neighbour resize of src to width w, keeping its aspect ratio.
func scale(src image.Image, w int) *image.NRGBA {
	b := src.Bounds()
	h := max(1, b.Dy()*w/max(1, b.Dx()))
	dst := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		sy := b.Min.Y + y*b.Dy()/h
		for x := range w {
			dst.Set(x, y, src.At(b.Min.X+x*b.Dx()/w, sy))
		}
	}
	return dst
}

// service serves the three endpoints on its two pools.
type service struct {
	proc     *knit.Pool // process lanes: render, thumb
	local    *knit.Pool // goroutine lanes: match
	deadline time.Duration
}

// options are the knobs of a service; the rest of its Config is knit's default.
type options struct {
	Memory          int64         // Limits.Memory of each process lane (0: none)
	Deadline        time.Duration // each request's deadline, passed into its call
	CountCallDeaths bool          // Restart.CountCallDeaths: the policy before issue 30
}

func newService(o options) (*service, error) {
	cfg := knit.Config{Name: "untrusted-proc", Lanes: 4, Runtime: knit.Process,
		Process: knit.ProcessConfig{Limits: knit.Limits{Memory: o.Memory}}}
	cfg.Restart.CountCallDeaths = o.CountCallDeaths
	proc, err := knit.NewPool(cfg, render, thumb)
	if err != nil {
		return nil, err
	}
	local, err := knit.NewPool(knit.Config{Name: "untrusted-local", Lanes: 4}, match)
	if err != nil {
		_ = proc.Close(context.Background())
		return nil, err
	}
	return &service{proc: proc, local: local, deadline: o.Deadline}, nil
}

func (s *service) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /render", s.render)
	mux.HandleFunc("POST /thumb", s.thumb)
	mux.HandleFunc("POST /match", s.match)
	return mux
}

func (s *service) close(ctx context.Context) error {
	return errors.Join(s.proc.Close(ctx), s.local.Close(ctx))
}

func (s *service) render(w http.ResponseWriter, r *http.Request) {
	var in RenderIn
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil {
		failBody(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.deadline)
	defer cancel()
	out, err := render.Call(ctx, s.proc, in)
	if err != nil {
		failCall(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, out)
}

func (s *service) thumb(w http.ResponseWriter, r *http.Request) {
	width, err := strconv.Atoi(r.URL.Query().Get("w"))
	if err != nil || width < 1 || width > 512 {
		fail(w, http.StatusBadRequest, "BAD_REQUEST", "w must be a width from 1 to 512")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		failBody(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.deadline)
	defer cancel()
	out, err := thumb.Call(ctx, s.proc, ThumbIn{PNG: body, Width: width})
	if err != nil {
		failCall(w, err)
		return
	}
	w.Header().Set("Content-Type", "image/png")
	_, _ = w.Write(out)
}

func (s *service) match(w http.ResponseWriter, r *http.Request) {
	var in MatchIn
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil {
		failBody(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.deadline)
	defer cancel()
	out, err := match.Call(ctx, s.local, in)
	if err != nil {
		failCall(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// statusOf maps a knit error to an HTTP status, per docs/architecture.md, "Error codes":
// the client's mistakes and bad inputs are 4xx, the rest 5xx.
func statusOf(code knit.Code) int {
	switch code {
	case knit.CodeTaskError, knit.CodeUnsupportedType:
		return http.StatusBadRequest // the input did not parse, or cannot cross
	case knit.CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case knit.CodeCanceled:
		return 499 // the client has gone; only the logs see it
	case knit.CodeTimeout:
		return http.StatusGatewayTimeout
	case knit.CodePoolClosed, knit.CodePoolUnavailable, knit.CodeOverloaded,
		knit.CodeThreadClosed, knit.CodeStartupFailed:
		return http.StatusServiceUnavailable
	default:
		// INVALID_ARGUMENT, UNKNOWN_TASK (the service's bugs), TASK_PANIC, the lane
		// deaths (WORKER_*) and POISON_CALL: the input may well be at fault, but a lane
		// died of it, which is a server error; the client should not retry it.
		return http.StatusInternalServerError
	}
}

// failBody answers a request body that could not be read or decoded.
func failBody(w http.ResponseWriter, err error) {
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		fail(w, http.StatusRequestEntityTooLarge, "TOO_LARGE", err.Error())
		return
	}
	fail(w, http.StatusBadRequest, "BAD_REQUEST", err.Error())
}

func failCall(w http.ResponseWriter, err error) {
	var ke *knit.Error
	if !errors.As(err, &ke) {
		fail(w, http.StatusInternalServerError, "INTERNAL", err.Error())
		return
	}
	status := statusOf(ke.Code)
	if ke.Lane >= 0 {
		w.Header().Set("X-Knit-Lane", strconv.Itoa(ke.Lane))
	}
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	fail(w, status, string(ke.Code), ke.Error())
}

// fail answers an error as JSON, its code also in the X-Knit-Code header (and the lane
// involved, if any, in X-Knit-Lane).
func fail(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Knit-Code", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": code, "error": msg})
}

func main() {
	knit.Main() // in a process lane this serves tasks and never returns

	addr := flag.String("addr", "127.0.0.1:8080", "address to serve on (without -load)")
	load := flag.Bool("load", false, "start the service in-process on loopback and load it, then print a report")
	clients := flag.Int("clients", 50, "concurrent clients (-load)")
	requests := flag.Int("requests", 20000, "requests in all (-load)")
	poison := flag.Float64("poison", 0.01, "fraction of requests that are poison for the process lanes (-load)")
	matchPoison := flag.Float64("match-poison", 0, "fraction of requests that are a never-advancing /match (-load)")
	memory := flag.Int64("memory", 256<<20, "Limits.Memory of each process lane, bytes")
	deadline := flag.Duration("deadline", 5*time.Second, "each request's deadline")
	countCallDeaths := flag.Bool("count-call-deaths", false, "Restart{CountCallDeaths: true}: count deaths a call caused toward crash-loop backoff (the old default)")
	seed := flag.Int64("seed", 1, "random seed of the request mix (-load)")
	kinds := flag.String("kinds", strings.Join(allKinds, ","), "poison kinds for the process lanes, sent in turn (-load)")
	verbose := flag.Bool("v", false, "list every poison request and every clean failure, in time order (-load)")
	flag.Parse()

	o := options{Memory: *memory, Deadline: *deadline, CountCallDeaths: *countCallDeaths}
	if *load {
		rep, err := runLoad(loadOptions{Service: o, Clients: *clients, Requests: *requests,
			Poison: *poison, MatchPoison: *matchPoison, Kinds: strings.Split(*kinds, ","), Seed: *seed})
		if err != nil {
			log.Fatal(err)
		}
		if *verbose {
			rep.list(os.Stdout)
		}
		rep.print(os.Stdout)
		return
	}

	svc, err := newService(o)
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: svc.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, os.Interrupt)
		<-stop
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	log.Printf("serving on http://%s (POST /render, /thumb?w=N, /match)", ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		log.Print(err)
	}
	if err := svc.close(context.Background()); err != nil {
		log.Print(err)
	}
}
