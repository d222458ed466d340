// Command screenshot takes a PNG of a knit inspector page in headless Chromium, once the
// page shows its lanes (and, with -crash, a crash in its timeline). It is what
// scripts/inspector-screenshot.sh runs to make docs/inspector.png.
//
//	go run ./screenshot -url http://127.0.0.1:PORT/ -out ../docs/inspector.png
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/knitgo/knit/e2e"
)

func main() {
	url := flag.String("url", "", "the inspector page")
	out := flag.String("out", "inspector.png", "the PNG to write")
	width := flag.Int("width", 1280, "viewport width")
	height := flag.Int("height", 900, "viewport height")
	crash := flag.Bool("crash", true, "wait until the timeline shows a crash")
	flag.Parse()
	if *url == "" {
		fmt.Fprintln(os.Stderr, "screenshot: -url is required")
		os.Exit(2)
	}
	if err := run(*url, *out, *width, *height, *crash); err != nil {
		fmt.Fprintln(os.Stderr, "screenshot:", err)
		os.Exit(1)
	}
}

func run(url, out string, width, height int, crash bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	browser, stop, err := e2e.Browser(ctx, width, height)
	if err != nil {
		return err
	}
	defer stop()
	ready := `document.querySelectorAll("#lanes tbody tr").length > 0 && document.body.dataset.status === "live"`
	if crash {
		ready += ` && document.querySelector('#timeline li.crash') !== null`
	}
	if err := chromedp.Do(browser, chromedp.Navigate(url)); err != nil {
		return err
	}
	if _, err := chromedp.Run(browser, chromedp.Poll[bool](ready, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		return fmt.Errorf("the page at %s never showed its lanes: %w", url, err)
	}
	png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
	if err != nil {
		return err
	}
	_ = chromedp.Do(browser, chromedp.Navigate("about:blank")) // end the page's stream
	if err := os.WriteFile(out, png, 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s (%d bytes)\n", out, len(png))
	return nil
}
