#!/usr/bin/env bash
# CPU time per call of the host process and of its lane processes, for a window of 1024
# Go futures on process lanes with the default Config (BenchmarkDefault/process/window):
# utime+stime from /proc of the benchmark and of its children, over WINDOW seconds in the
# middle of a long run (docs/benchmarks.md, "What a window of futures costs the host").
#
#	bash scripts/cpu-per-call.sh [lanes] [window-seconds]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=/usr/local/go/bin:$PATH
lanes=${1:-1}
window=${2:-3}
bin=$(mktemp)
out=$(mktemp)
trap 'rm -f "$bin" "$out"' EXIT
go test -c -o "$bin" .
"$bin" -test.run '^$' -test.bench "Default/process/window/lanes=$lanes\$" -test.benchtime 12000000x >"$out" 2>&1 &
host=$!
sleep 2 # past the pool's start and warm-up
ticks() { # pid → utime+stime in clock ticks, for the host and each lane process
	for p in $host $(pgrep -P "$host"); do
		awk -v p="$p" '{print p, $14 + $15}' "/proc/$p/stat" 2>/dev/null || true
	done
}
before=$(ticks)
sleep "$window"
after=$(ticks)
wait "$host"
rate=$(awk '/calls\/s/ {for (i = 1; i < NF; i++) if ($(i+1) == "calls/s") print $i}' "$out")
hz=$(getconf CLK_TCK)
join <(sort <<<"$before") <(sort <<<"$after") | awk -v h="$host" -v w="$window" -v r="$rate" -v hz="$hz" '
	{ d = ($3 - $2) / hz; if ($1 == h) host += d; else lanes += d }
	END {
		printf "%.0f calls/s; host %.2f s CPU (%.0f ns a call), lanes %.2f s (%.0f ns a call) over %d s\n",
			r, host, host / (w * r) * 1e9, lanes, lanes / (w * r) * 1e9, w
	}'
