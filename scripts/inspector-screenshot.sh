#!/usr/bin/env bash
# Regenerates docs/inspector.png, the README's picture of the live inspector: runs the demo
# with -hold (its process pool up after a crash and a SIGKILL, with a trickle of calls),
# takes a PNG of the inspector page in headless Chromium (e2e/screenshot), then ends the
# demo with SIGINT. Needs Go and Chromium (Debian: apt-get install chromium).
#
#	bash scripts/inspector-screenshot.sh [out.png]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/usr/local/go/bin:$PATH
out=$(realpath -m "${1:-docs/inspector.png}")
work=$(mktemp -d)
demo_pid=
cleanup() {
	if [[ -n $demo_pid ]] && kill -0 "$demo_pid" 2>/dev/null; then
		kill -INT "$demo_pid"
		wait "$demo_pid" || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/knit" ./cmd/knit
"$work/knit" demo -hold 2>"$work/demo.log" &
demo_pid=$!

# The demo logs the inspector's address at once, and "holding" once the walk-through is done.
url=
for _ in $(seq 600); do
	if grep -q 'holding the process pool up' "$work/demo.log"; then
		url=$(grep -o 'http://127\.0\.0\.1:[0-9]*/' "$work/demo.log" | head -1)
		break
	fi
	if ! kill -0 "$demo_pid" 2>/dev/null; then
		cat "$work/demo.log" >&2
		echo "the demo ended before holding its pool" >&2
		exit 1
	fi
	sleep 0.1
done
if [[ -z $url ]]; then
	cat "$work/demo.log" >&2
	echo "the demo did not hold its pool within 60s" >&2
	exit 1
fi
echo "inspector at $url"
(cd e2e && go run ./screenshot -url "$url" -out "$out")
