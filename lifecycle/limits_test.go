package lifecycle

import (
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestClassifyLimits(t *testing.T) {
	const mem = 256 << 20
	cases := []struct {
		name string
		x    Exit
		code Code
		want []string
	}{
		{"cgroup OOM kill", Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, OOMKills: 1, MemoryLimit: mem},
			CodeWorkerOutOfMemory, []string{"out-of-memory killer", "memory limit 256 MiB", "SIGKILL"}},
		{"runtime out of memory", Exit{Ready: true, Status: 2, Failure: "fatal error: runtime: out of memory", MemoryLimit: mem},
			CodeWorkerOutOfMemory, []string{"fatal error: runtime: out of memory, memory limit 256 MiB (exit status 2)"}},
		{"runtime cannot allocate", Exit{Ready: true, Status: 2, Failure: "fatal error: runtime: cannot allocate memory"},
			CodeWorkerOutOfMemory, []string{"cannot allocate memory (exit status 2)"}},
		{"stack out of memory", Exit{Ready: true, Status: 2, Failure: "fatal error: out of memory (stackalloc)"},
			CodeWorkerOutOfMemory, nil},
		{"cgo cannot create a thread under RLIMIT_DATA", Exit{Ready: true, Status: 2, DataLimited: true, MemoryLimit: mem,
			Failure: "runtime/cgo: pthread_create failed: Resource temporarily unavailable", Crash: []string{"SIGABRT: abort", "goroutine 0 [idle]:"}},
			CodeWorkerOutOfMemory, []string{"pthread_create failed", "memory limit 256 MiB"}},
		{"cgo cannot create a thread, under a process limit too", Exit{Ready: true, Status: 2, MemoryLimit: mem,
			Failure: "runtime/cgo: pthread_create failed: Resource temporarily unavailable", Crash: []string{"SIGABRT: abort"}},
			CodeWorkerCrashed, []string{"pthread_create failed"}},
		{"a panic saying out of memory is a task's", Exit{Ready: true, Status: 2, Failure: "panic: out of memory"},
			CodeWorkerCrashed, []string{"panic: out of memory"}},
		{"OOM kill of a child, lane exits on its own", Exit{Ready: true, Status: 3, OOMKills: 1},
			CodeWorkerExited, []string{"exit status 3"}},
		{"OOM kill of a child, lane segfaults", Exit{Ready: true, Status: -1, Signal: syscall.SIGSEGV, OOMKills: 1},
			CodeWorkerCrashed, []string{"SIGSEGV"}},
		{"SIGKILL without an OOM kill", Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, MemoryLimit: mem},
			CodeWorkerCrashed, []string{"SIGKILL"}},
		{"CPU limit: killed at the limit", Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, CPUTime: 2010 * time.Millisecond, CPULimit: 2 * time.Second},
			CodeWorkerCPULimit, []string{"CPU time limit of 2s", "2.01s used", "SIGKILL"}},
		{"CPU limit: SIGXCPU", Exit{Ready: true, Status: -1, Signal: syscall.SIGXCPU, CPUTime: 2 * time.Second, CPULimit: 2 * time.Second},
			CodeWorkerCPULimit, nil},
		{"CPU limit: sampled times fall short", Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, CPUTime: 982 * time.Millisecond, CPULimit: time.Second},
			CodeWorkerCPULimit, []string{"982ms used"}},
		{"CPU under the limit", Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, CPUTime: time.Second, CPULimit: 2 * time.Second},
			CodeWorkerCrashed, nil},
		{"CPU used up, but the lane exited on its own", Exit{Ready: true, Status: 3, CPUTime: 2 * time.Second, CPULimit: 2 * time.Second},
			CodeWorkerExited, nil},
		{"CPU limit: the lane's exit on SIGXCPU", Exit{Ready: true, Status: ExitCPULimit, CPUTime: 700 * time.Millisecond, CPULimit: time.Second},
			CodeWorkerCPULimit, []string{"CPU time limit of 1s", "700ms used", "exit status 80"}},
		{"exit 80 early is an exit", Exit{Ready: true, Status: ExitCPULimit, CPUTime: 100 * time.Millisecond, CPULimit: time.Second},
			CodeWorkerExited, []string{"exit status 80"}},
		{"exit 80 without a CPU limit is an exit", Exit{Ready: true, Status: ExitCPULimit, CPUTime: 2 * time.Second},
			CodeWorkerExited, nil},
		{"hard timeout wins over an OOM count", Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, OOMKills: 1, HardTimeout: "slow"},
			CodeWorkerCrashed, []string{"hard timeout"}},
		{"unresponsive wins over CPU use", Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, CPUTime: 3 * time.Second, CPULimit: time.Second, Unresponsive: "3s"},
			CodeWorkerUnresponsive, nil},
		{"stopped wins", Exit{Stopping: true, Ready: true, Status: -1, Signal: syscall.SIGKILL, OOMKills: 1},
			CodeThreadClosed, nil},
		{"OOM before ready is a startup failure", Exit{Status: 2, Failure: "fatal error: runtime: out of memory"},
			CodeStartupFailed, []string{"out of memory"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := Classify(tc.x)
			if e.Code != tc.code {
				t.Fatalf("code %s, want %s (%v)", e.Code, tc.code, e)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Error(), w) {
					t.Errorf("%q lacks %q", e.Error(), w)
				}
			}
		})
	}
	// The runtime's account of the abort is in the error's report, not its message.
	var r *LaneReport
	if !errors.As(Classify(cases[4].x), &r) || len(r.Stack) == 0 || r.Stack[0] != "SIGABRT: abort" {
		t.Errorf("report of %q: %+v", cases[4].name, r)
	}
	oom := Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, OOMKills: 1}
	cpu := Exit{Ready: true, Status: ExitCPULimit, CPUTime: time.Second, CPULimit: time.Second}
	if !errors.Is(Classify(oom), ErrOutOfMemory) || !errors.Is(Classify(cpu), ErrCPULimit) {
		t.Fatal("the sentinels do not match the new codes")
	}
}

func TestGoMemoryLimit(t *testing.T) {
	for _, c := range []struct{ hard, want int64 }{
		{0, 0}, {-1, 0},
		{256 << 20, 224 << 20}, // an eighth
		{64 << 20, 48 << 20},   // 16 MiB
		{16 << 20, 8 << 20},    // at most half
		{8 << 30, 7 << 30},
	} {
		if got := GoMemoryLimit(c.hard); got != c.want {
			t.Errorf("GoMemoryLimit(%d) = %d, want %d", c.hard, got, c.want)
		}
	}
}

func TestCPUSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {-time.Second, 0}, {time.Nanosecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}} {
		if got := CPUSeconds(c.d); got != c.want {
			t.Errorf("CPUSeconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestParseBoot(t *testing.T) {
	good := `{"version":1,"lane":2,"tasks":[],"limits":{"v":1,"data":268435456,"go_mem":1,"cpu_s":2,"nofile":64,"nproc":100}}`
	b, err := ParseBoot([]byte(good))
	if err != nil || b.Lane != 2 || b.Limits == nil || b.Limits.Data != 256<<20 || b.Limits.Files != 64 || b.Limits.Core {
		t.Fatalf("%+v %+v %v", b, b.Limits, err)
	}
	if b, err := ParseBoot([]byte(`{"version":1}`)); err != nil || b.Limits != nil {
		t.Fatalf("a record without limits (an older host): %+v %v", b, err)
	}
	for _, bad := range []string{
		`{"limits":{"data":1}}`,        // no version
		`{"limits":{"v":2}}`,           // a later version
		`{"limits":{"v":1,"data":-1}}`, // negative
		`{"limits":{"v":1,"cpu_s":-5}}`,
		`{"limits":{"v":1,"nofile":2000000000}}`,
		`{"limits":{"v":1,"nproc":-1}}`,
		`{"limits":{"v":1,"go_mem":-1}}`,
		`{"limits":{"v":1,"data":1e30}}`, // does not fit
		`{"limits":[]}`,
		`not json`,
	} {
		if _, err := ParseBoot([]byte(bad)); err == nil {
			t.Errorf("ParseBoot(%s) accepted it", bad)
		}
	}
}

// FuzzParseBoot: a boot record is a lane's first input; whatever it holds, ParseBoot returns
// an error or limits a lane can apply.
func FuzzParseBoot(f *testing.F) {
	f.Add([]byte(`{"version":1,"lane":2,"limits":{"v":1,"data":268435456,"cpu_s":2,"nofile":64}}`))
	f.Add([]byte(`{"limits":{"v":1,"core":true}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := ParseBoot(data)
		if err != nil || b.Limits == nil {
			return
		}
		l := b.Limits
		if l.Check() != nil || l.Data < 0 || l.CPU < 0 || l.Files < 0 || l.Procs < 0 || l.GoMemory < 0 {
			t.Fatalf("accepted limits %+v", l)
		}
		if _, err := json.Marshal(b); err != nil {
			t.Fatal(err)
		}
	})
}
