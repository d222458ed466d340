// Command report lines up the stamps that a knitstamp build wrote (package stamp) call by
// call, and prints how long a sequential call spends between each point of stamp.Path and
// the next: quartiles over the calls that passed every point, the first tenth of the run
// left out as warm-up; then, for the slowest hundredth of the calls, which hop held each
// longest.
//
//	go run ./internal/stamp/report DIR
package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/knitgo/knit/internal/stamp"
)

type rec struct {
	t int64
	p stamp.Point
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: report DIR (the KNIT_STAMP directory of a knitstamp build)")
		os.Exit(2)
	}
	recs, err := load(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	slices.SortFunc(recs, func(a, b rec) int { return int(a.t - b.t) })
	var calls [][]rec // each from a CallStart to the next
	for _, r := range recs {
		if r.p == stamp.CallStart {
			calls = append(calls, nil)
		}
		if len(calls) > 0 {
			calls[len(calls)-1] = append(calls[len(calls)-1], r)
		}
	}
	calls = calls[len(calls)/10:]
	hops := make([][]int64, len(stamp.Path)-1)
	var totals []int64
	for _, c := range calls {
		if d, ok := walk(c); ok {
			var sum int64
			for i, v := range d {
				hops[i] = append(hops[i], v)
				sum += v
			}
			totals = append(totals, sum)
		}
	}
	fmt.Printf("%d calls, %d passed every point\n", len(calls), len(totals))
	if len(totals) == 0 {
		return
	}
	fmt.Printf("%-28s → %-28s %9s %9s %9s\n", "from", "to", "p25", "median", "p75")
	for i, h := range hops {
		q := quartiles(h)
		fmt.Printf("%-28s → %-28s %9v %9v %9v\n", stamp.Names[stamp.Path[i]], stamp.Names[stamp.Path[i+1]], q[0], q[1], q[2])
	}
	q := quartiles(totals)
	fmt.Printf("%-59s %9v %9v %9v\n", "whole call", q[0], q[1], q[2])
	slowest(calls)
}

// slowest prints where the slowest hundredth of the calls lost their time: for each, the
// longest gap between two consecutive stamps (whatever points the call passed), and how
// often each pair of points held it. It takes every call with both ends stamped, as the
// tail is often the calls that missed a point.
func slowest(calls [][]rec) {
	type call struct {
		total int64
		c     []rec
	}
	var all []call
	for _, c := range calls {
		for _, r := range c {
			if r.p == stamp.CallEnd {
				all = append(all, call{r.t - c[0].t, c})
				break
			}
		}
	}
	if len(all) < 100 {
		return
	}
	slices.SortFunc(all, func(a, b call) int { return int(a.total - b.total) })
	tail := all[len(all)-len(all)/100:]
	type gap struct{ from, to stamp.Point }
	count, sum := map[gap]int{}, map[gap]int64{}
	for _, c := range tail {
		var worst gap
		var d int64 = -1
		for i := 1; i < len(c.c); i++ {
			if g := c.c[i].t - c.c[i-1].t; g > d {
				worst, d = gap{c.c[i-1].p, c.c[i].p}, g
			}
		}
		count[worst]++
		sum[worst] += d
	}
	gaps := make([]gap, 0, len(count))
	for g := range count {
		gaps = append(gaps, g)
	}
	slices.SortFunc(gaps, func(a, b gap) int { return count[b] - count[a] })
	fmt.Printf("\nslowest 1%% (%d of %d calls, from %v): the longest gap in each\n", len(tail), len(all),
		time.Duration(tail[0].total).Round(time.Microsecond))
	fmt.Printf("%-28s → %-28s %6s %9s\n", "from", "to", "calls", "mean gap")
	for _, g := range gaps {
		fmt.Printf("%-28s → %-28s %6d %9v\n", stamp.Names[g.from], stamp.Names[g.to], count[g],
			time.Duration(sum[g]/int64(count[g])).Round(time.Microsecond))
	}
}

// walk finds, for each point of the path, its first stamp after the previous point's, and
// returns the time between each and the next; false if the call missed one.
func walk(c []rec) ([]int64, bool) {
	d := make([]int64, 0, len(stamp.Path)-1)
	prev, j := c[0].t, 0
	for _, p := range stamp.Path[1:] {
		for j < len(c) && (c[j].p != p || c[j].t < prev) {
			j++
		}
		if j == len(c) {
			return nil, false
		}
		d = append(d, c[j].t-prev)
		prev = c[j].t
	}
	return d, true
}

func quartiles(v []int64) [3]time.Duration {
	slices.Sort(v)
	at := func(f float64) time.Duration {
		return time.Duration(v[int(f*float64(len(v)-1))]).Round(100 * time.Nanosecond)
	}
	return [3]time.Duration{at(0.25), at(0.5), at(0.75)}
}

func load(dir string) ([]rec, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no stamps in %s", dir)
	}
	var recs []rec
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r rec
			if _, err := fmt.Sscanf(sc.Text(), "%d %d", &r.t, &r.p); err == nil {
				recs = append(recs, r)
			}
		}
		f.Close()
	}
	return recs, nil
}
