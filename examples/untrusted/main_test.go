package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/png"
	"io"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/knitgo/knit"
)

func TestMain(m *testing.M) {
	knit.Main()
	if _, ok := os.LookupEnv("GORACE"); !ok {
		os.Setenv("GORACE", "atexit_sleep_ms=0") // race-built lanes would sleep at exit
	}
	goleak.VerifyTestMain(m)
}

// memory is the lanes' limit in the tests: none under the race detector, whose shadow
// memory does not fit a 256 MiB RLIMIT_DATA (the alloc poison is then left out).
func memory() int64 {
	if raceEnabled {
		return 0
	}
	return 256 << 20
}

// TestServe checks each endpoint's answers: a rendered template, a thumbnail of the asked
// width, the matches of a regexp, 400 for bad input, and a poisoned template that kills its
// lane answered 500 with the lane's code while the next request is served.
func TestServe(t *testing.T) {
	svc, err := newService(options{Memory: memory(), Deadline: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.close(context.Background())
	srv := httptest.NewServer(svc.handler())
	defer srv.Close()

	post := func(path, ctype string, body []byte) (int, string, []byte) {
		t.Helper()
		resp, err := srv.Client().Post(srv.URL+path, ctype, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header.Get("X-Knit-Code"), b
	}
	postJSON := func(path string, v any) (int, string, []byte) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return post(path, "application/json", b)
	}

	status, _, body := postJSON("/render", RenderIn{Template: `Hello, {{.Name | upper}}: {{join .Items "+"}}`,
		Data: Page{Name: "knit", Items: []string{"a", "b"}}})
	if status != 200 || string(body) != "Hello, KNIT: a+b" {
		t.Errorf("render: %d %q", status, body)
	}
	if status, code, _ := postJSON("/render", RenderIn{Template: "{{.Name"}); status != 400 || code != string(knit.CodeTaskError) {
		t.Errorf("a template that does not parse: %d %s, want 400 %s", status, code, knit.CodeTaskError)
	}
	if status, code, _ := postJSON("/render", RenderIn{Template: "{{crash}}"}); status != 500 || code != string(knit.CodeWorkerCrashed) {
		t.Errorf("a template that crashes its lane: %d %s, want 500 %s", status, code, knit.CodeWorkerCrashed)
	}
	if status, code, _ := postJSON("/render", RenderIn{Template: "{{exit}}"}); status != 500 || code != string(knit.CodeWorkerExited) {
		t.Errorf("a template that exits its lane: %d %s, want 500 %s", status, code, knit.CodeWorkerExited)
	}

	status, _, body = post("/thumb?w=64", "image/png", picture(image.Point{X: 320, Y: 240}, 1))
	if status != 200 {
		t.Fatalf("thumb: %d %s", status, body)
	}
	img, err := png.Decode(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 64 || b.Dy() != 48 {
		t.Errorf("thumbnail of 320×240 at w=64 is %v, want 64×48", b.Size())
	}
	if status, code, _ := post("/thumb?w=64", "image/png", []byte("GIF89a")); status != 400 || code != string(knit.CodeTaskError) {
		t.Errorf("not a PNG: %d %s, want 400 %s", status, code, knit.CodeTaskError)
	}
	if status, _, _ := post("/thumb?w=64", "image/png", make([]byte, maxBody+1)); status != 413 {
		t.Errorf("a body over %d bytes: %d, want 413", maxBody, status)
	}

	status, _, body = postJSON("/match", MatchIn{Pattern: `\d{3}-\d{4}`, Text: "call 555-0100 or 555-0199"})
	var got []string
	if err := json.Unmarshal(body, &got); status != 200 || err != nil || !slices.Equal(got, []string{"555-0100", "555-0199"}) {
		t.Errorf("match: %d %s", status, body)
	}
	if status, code, _ := postJSON("/match", MatchIn{Pattern: `(`}); status != 400 || code != string(knit.CodeTaskError) {
		t.Errorf("a regexp that does not compile: %d %s, want 400 %s", status, code, knit.CodeTaskError)
	}
}

// TestLoad is a short load with poison: every request is answered, no poison succeeds,
// no clean request is blamed on its client, and every endpoint serves clean requests.
func TestLoad(t *testing.T) {
	requests := 300
	if raceEnabled { // race-built lanes are ten times slower
		requests = 120
	}
	rep, err := runLoad(loadOptions{Service: options{Memory: memory(), Deadline: 5 * time.Second},
		Clients: 8, Requests: requests, Poison: 0.04, MatchPoison: 0.01, Seed: 30})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.print(&out)
	t.Log("\n" + out.String())

	okBy := map[string]int{}
	poison := 0
	for _, x := range rep.results {
		switch {
		case x.status == 0:
			t.Errorf("%s %q at %v: no answer: %v", x.req.path, x.req.poison, x.at, x.err)
		case x.req.poison != "":
			poison++
			if x.status == 200 {
				t.Errorf("poison %q to %s succeeded", x.req.poison, x.req.path)
			}
		case x.status >= 400 && x.status < 500:
			t.Errorf("clean request to %s answered %d %s: %s", x.req.path, x.status, x.code, x.msg)
		case x.status == 200:
			okBy[x.req.endpoint]++
		}
	}
	if poison == 0 {
		t.Error("the load sent no poison")
	}
	for _, e := range []string{"render", "thumb", "match"} {
		if okBy[e] == 0 {
			t.Errorf("no clean /%s request succeeded", e)
		}
	}
}
