// Package e2e holds knit's end-to-end tests that drive a real browser: the inspector page,
// checked in headless Chromium against a running pool. It is a module of its own so that
// the browser driver (chromedp) stays out of knit's go.mod; .ci/run runs it explicitly.
// It also holds the program that takes the README's screenshot (./screenshot).
package e2e
