package steal

import (
	"os"
	"testing"
	"time"
)

func TestMeasure(t *testing.T) {
	if os.Getenv("MEASURE") == "" {
		t.Skip()
	}
	for _, c := range []mcfg{
		{disc: Dekker, n: 2, width: 2, S: 6, calls: 2, victim: 0},
		{disc: Dekker, n: 2, width: 8, S: 24, calls: 2, victim: 0},
		{disc: Dekker, n: 2, width: 2, S: 6, calls: 3, victim: 0},
		{disc: Dekker, n: 3, width: 1, S: 4, calls: 2, victim: 1},
		{disc: Dekker, n: 3, width: 2, S: 8, calls: 2, victim: 1},
		{disc: Ticket, n: 2, width: 8, S: 8, calls: 3, victim: 0},
		{disc: Ticket, n: 4, width: 2, S: 4, calls: 2, victim: 1},
	} {
		st := time.Now()
		e := newExplorer(c)
		e.limit = 1500000
		e.explore(e.initial())
		t.Logf("%v: %d states %d trans depth %d err %v  %v", c, e.states, e.trans, e.maxDeep, e.err, time.Since(st))
	}
}
