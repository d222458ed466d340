package cgroup

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// envAlloc makes the test binary a process that allocates without bound (TestOOMKills).
const envAlloc = "KNIT_CGROUP_TEST_ALLOC"

var hoard [][]byte

func TestMain(m *testing.M) {
	if os.Getenv(envAlloc) != "" {
		for {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			hoard = append(hoard, b)
		}
	}
	goleak.VerifyTestMain(m)
}
