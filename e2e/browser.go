package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"

	"github.com/chromedp/chromedp"
)

// ErrNoBrowser is returned when no Chromium is installed.
var ErrNoBrowser = errors.New("e2e: no chromium, chromium-browser or google-chrome on PATH (Debian: apt-get install chromium)")

// Browser starts a headless Chromium for ctx and returns a context to drive it with;
// cancel ends the browser and waits for it.
func Browser(ctx context.Context, width, height int) (context.Context, context.CancelFunc, error) {
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		return nil, nil, ErrNoBrowser
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.WindowSize(width, height),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	if err := chromedp.Do(bctx); err != nil { // start it now, to report a browser that will not
		cancelBrowser()
		cancelAlloc()
		return nil, nil, err
	}
	return bctx, func() { cancelBrowser(); cancelAlloc() }, nil
}
