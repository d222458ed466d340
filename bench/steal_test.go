//go:build linux

package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestPercentile(t *testing.T) {
	var s []int64
	for i := int64(1); i <= 200; i++ {
		s = append(s, i)
	}
	for _, c := range []struct {
		p    float64
		want float64
	}{{0.5, 100}, {0.99, 198}, {1, 200}, {0, 1}} {
		if got := percentile(s, c.p); got != c.want {
			t.Errorf("percentile(1..200, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 0.99); got != 0 {
		t.Errorf("percentile(nil) = %v", got)
	}
	recordFastLatency([][]int64{{5, 1, 3}, nil, {2, 4}})
	if p50, p99, n, ok := takeFastLatency(); !ok || p50 != 3 || p99 != 5 || n != 5 {
		t.Errorf("recorded %v %v %v %v, want 3 5 5 true", p50, p99, n, ok)
	}
	if _, _, _, ok := takeFastLatency(); ok {
		t.Error("takeFastLatency kept its figures")
	}
}

// Every stealing row's name contains "steal", so -filter steal runs them
// alone, and each (runtime, dispatch) has the four rows the targets use.
func TestStealRows(t *testing.T) {
	rows := stealScenarios()
	want := 0
	for _, d := range slices.Concat(stealDispatches, privateDispatches) {
		if d.goroutines {
			want += 4 // goroutine lanes only
		} else {
			want += 2 * 4
		}
	}
	if len(rows) != want {
		t.Fatalf("%d stealing rows, want %d", len(rows), want)
	}
	for _, s := range rows {
		if !strings.Contains(s.name, "steal") || s.meta.Dispatch == "" || s.meta.Workload == "" {
			t.Errorf("row %q: name or meta %+v", s.name, s.meta)
		}
	}
	var buf bytes.Buffer
	writeFastLatency(&buf, syntheticResults())
	out := buf.String()
	for _, want := range []string{"| scenario | fast p50 | fast p99 | fast calls | calls/s |",
		"| knit process, 4 lanes, steal Dekker: skewed, 1024 goroutines calling | 10.0 µs | 100.0 µs | 900 | 1.00M |"} {
		if !strings.Contains(out, want) {
			t.Errorf("fast-latency table lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	writeFastLatency(&buf, nil)
	if buf.Len() != 0 {
		t.Errorf("fast-latency table without skewed rows: %q", buf.String())
	}
}
