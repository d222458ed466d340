package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/inspect"
)

var square = knit.Define("e2e.square", func(_ context.Context, n int64) (int64, error) { return n * n, nil })

func TestMain(m *testing.M) {
	knit.Main() // the pool's process lanes are this test binary
	os.Exit(m.Run())
}

// TestInspectorPage opens the inspector of a pool of process lanes in headless Chromium,
// checks that it lists every lane, then SIGKILLs a lane and checks that the same page —
// never reloaded — shows the crash, with its code and reason, and the restart.
func TestInspectorPage(t *testing.T) {
	const lanes = 3
	pool, err := knit.NewPool(knit.Config{Lanes: lanes, Runtime: knit.Process}, square)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close(context.Background())
	mux := http.NewServeMux()
	mux.Handle("/debug/knit/", http.StripPrefix("/debug/knit", inspect.Handler(pool)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	browser, stop, err := Browser(ctx, 1280, 900)
	if errors.Is(err, ErrNoBrowser) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	// The page closes its stream before the server does, so that srv.Close does not wait.
	defer chromedp.Do(browser, chromedp.Navigate("about:blank"))

	for i := range 8 {
		if _, err := square.Call(ctx, pool, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	before := pool.Stats().Lanes
	if err := chromedp.Do(browser, chromedp.Navigate(srv.URL+"/debug/knit/")); err != nil {
		t.Fatal(err)
	}
	// Every lane, ready, with its process and the process's memory.
	var want string
	for _, l := range before {
		want += fmt.Sprintf(`&& (r => r !== null && Number(r.dataset.rss) > 0)(document.querySelector('#lanes tr[data-lane="%d"][data-state="ready"][data-pid="%d"]')) `, l.Lane, l.PID)
	}
	waitFor(t, browser, `document.querySelectorAll("#lanes tbody tr").length === 3 `+want+
		`&& document.querySelector('#timeline li[data-to="ready"]') !== null`)
	// A mark on this page: a reload would lose it.
	if err := chromedp.Do(browser, chromedp.Evaluate[chromedp.Void](`window.knitMark = "this page"`)); err != nil {
		t.Fatal(err)
	}

	victim := before[1]
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, browser, fmt.Sprintf(`window.knitMark === "this page"
		&& [...document.querySelectorAll('#timeline li[data-lane="1"][data-to="crashed"][data-code="WORKER_CRASHED"]')].some(li => li.textContent.includes("SIGKILL"))
		&& document.querySelector('#timeline li[data-lane="1"][data-from="crashed"][data-to="restarting"]') !== null
		&& document.querySelector('#timeline li[data-lane="1"][data-to="ready"][data-incarnation="1"]') !== null
		&& (r => r !== null && r.dataset.state === "ready" && r.dataset.incarnation === "1" && r.dataset.pid !== "%d" && r.dataset.pid !== "0")(document.querySelector('#lanes tr[data-lane="1"]'))`,
		victim.PID))
}

// waitFor polls the page until expr is true, within a deadline; on failure it reports
// what the page shows.
func waitFor(t *testing.T, browser context.Context, expr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(browser, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		text, _ := chromedp.Run(browser, chromedp.Evaluate[string](`document.querySelector("main").innerText`))
		t.Fatalf("page never showed %s: %v\npage:\n%s", expr, err, text)
	}
}
