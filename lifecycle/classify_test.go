package lifecycle

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

func TestClassify(t *testing.T) {
	tail := []string{"doing work", "more work"}
	cases := []struct {
		name string
		x    Exit
		code Code
		want []string // in the message
		// What the lane printed: in the LaneReport, never in the message.
		failure      string
		stack, stail []string
	}{
		{name: "stop acknowledged", x: Exit{Stopping: true, Ready: true, Status: 0}, code: CodeThreadClosed, want: []string{"exit status 0"}},
		{name: "killed after a stop request", x: Exit{Stopping: true, Ready: true, Status: -1, Signal: syscall.SIGKILL}, code: CodeThreadClosed, want: []string{"SIGKILL"}},
		{name: "stop request wins over a crash", x: Exit{Stopping: true, Ready: true, Status: 2, Failure: "panic: x"}, code: CodeThreadClosed},
		{name: "fatal message before ready", x: Exit{Status: 78, Fatal: `unknown task "x"`}, code: CodeStartupFailed, want: []string{`unknown task "x"`, "exit status 78"}},
		{name: "startup timeout", x: Exit{Status: -1, Signal: syscall.SIGKILL, Startup: time.Second}, code: CodeStartupFailed, want: []string{"startup timeout of 1s"}},
		{name: "exit before ready", x: Exit{Status: 0, Tail: tail}, code: CodeStartupFailed, want: []string{"exited before ready: exit status 0"}, stail: tail},
		{name: "signal", x: Exit{Ready: true, Status: -1, Signal: syscall.SIGSEGV, Tail: tail}, code: CodeWorkerCrashed, want: []string{"SIGSEGV"}, stail: tail},
		{name: "go panic", x: Exit{Ready: true, Status: 2, Failure: "panic: boom", Tail: tail}, code: CodeWorkerCrashed, want: []string{"panic: boom (exit status 2)"}, failure: "panic: boom", stail: tail},
		{name: "go fatal error", x: Exit{Ready: true, Status: 2, Failure: "fatal error: fault"}, code: CodeWorkerCrashed, want: []string{"fatal error: fault"}, failure: "fatal error: fault"},
		{name: "hard timeout", x: Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, HardTimeout: `task "slow" ran over 1s`}, code: CodeWorkerCrashed, want: []string{"hard timeout", "slow"}},
		{name: "corrupt ring", x: Exit{Ready: true, Status: -1, Signal: syscall.SIGKILL, Corrupt: errors.New("bad tag")}, code: CodeWorkerCrashed, want: []string{"corrupt ring", "bad tag"}},
		{name: "exit 2 without a Go failure", x: Exit{Ready: true, Status: 2}, code: CodeWorkerExited, want: []string{"exit status 2"}},
		{name: "os.Exit(3)", x: Exit{Ready: true, Status: 3}, code: CodeWorkerExited, want: []string{"exit status 3"}},
		{name: "exit 0 on its own", x: Exit{Ready: true, Status: 0}, code: CodeWorkerExited, want: []string{"exit status 0"}},
		{name: "hand-off refused", x: Exit{Status: -1, Signal: syscall.SIGKILL, Handoff: errors.New("peer pid 9 is not the lane")}, code: CodeStartupFailed, want: []string{"shared memory", "peer pid 9"}},
		{name: "crash report", x: Exit{Ready: true, Status: 2, Failure: "fatal error: fault",
			Crash: []string{"[signal SIGSEGV: segmentation violation]", "goroutine 7 [running]:", "main.fault() at /x/main.go:11"},
			Tail:  []string{"goroutine 9 [select]:", "knit.(*abortWatch).run() at /y.go:3"}},
			code: CodeWorkerCrashed, want: []string{"fatal error: fault (exit status 2)"}, failure: "fatal error: fault",
			stack: []string{"[signal SIGSEGV: segmentation violation]", "goroutine 7 [running]:", "main.fault() at /x/main.go:11"},
			stail: []string{"goroutine 9 [select]:", "knit.(*abortWatch).run() at /y.go:3"}},
		{name: "panic before ready", x: Exit{Status: 2, Failure: "panic: init failed", Crash: []string{"goroutine 1 [running]:", "main.init() at /m.go:3"}},
			code: CodeStartupFailed, want: []string{"exited before ready: panic: init failed (exit status 2)"}, failure: "panic: init failed",
			stack: []string{"goroutine 1 [running]:", "main.init() at /m.go:3"}},
		{name: "boot failure before a region", x: Exit{Status: 78, Tail: []string{"some init output", "knit lane 0: knit/shm: mmap: cannot allocate memory"}},
			code: CodeStartupFailed, want: []string{"exited before ready: knit lane 0: knit/shm: mmap: cannot allocate memory (exit status 78)"},
			stail: []string{"some init output", "knit lane 0: knit/shm: mmap: cannot allocate memory"}},
		{name: "waiting failed", x: Exit{Ready: true, Status: 1, Err: syscall.ECHILD, Tail: tail}, code: CodeWorkerExited, want: []string{"exit status 1"}, stail: tail},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.x.Lane = 3
			e := Classify(tc.x)
			if e.Code != tc.code || e.Lane != 3 {
				t.Fatalf("code %s lane %d, want %s lane 3 (%v)", e.Code, e.Lane, tc.code, e)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Error(), w) {
					t.Errorf("%q lacks %q", e.Error(), w)
				}
			}
			for _, l := range append(append(slices.Clone(tc.stack), tc.stail...), " | ", ".go:") {
				if slices.ContainsFunc(tc.want, func(w string) bool { return strings.Contains(w, l) }) {
					continue // the reason itself (a boot failure's line)
				}
				if strings.Contains(e.Message, l) || strings.Contains(e.Error(), l) {
					t.Errorf("%q has the lane's output %q", e.Error(), l)
				}
			}
			if strings.Contains(e.Error(), "\n") {
				t.Errorf("%q is not one line", e.Error())
			}
			var r *LaneReport
			printed := tc.failure != "" || tc.stack != nil || tc.stail != nil
			if errors.As(e, &r) != printed {
				t.Fatalf("LaneReport %+v, want one: %v", r, printed)
			}
			if !printed {
				return
			}
			if r.Failure != tc.failure || !slices.Equal(r.Stack, tc.stack) || !slices.Equal(r.Tail, tc.stail) {
				t.Errorf("report %+v, want failure %q, stack %q, tail %q", r, tc.failure, tc.stack, tc.stail)
			}
			if tc.x.Err != nil && (r.Err != tc.x.Err || !errors.Is(e, tc.x.Err)) {
				t.Errorf("the report hides what lay under the end: %v", r.Err)
			}
		})
	}
}

func TestErrorIsByCode(t *testing.T) {
	e := &Error{Code: CodeWorkerCrashed, Lane: 1, Message: "x", Cause: syscall.EPIPE}
	if !errors.Is(e, ErrWorkerCrashed) || errors.Is(e, ErrWorkerExited) || !errors.Is(e, syscall.EPIPE) {
		t.Fatal("errors.Is does not match by code and cause")
	}
	if got := e.Error(); !strings.Contains(got, "WORKER_CRASHED") || !strings.Contains(got, "lane 1") {
		t.Fatalf("Error() = %q", got)
	}
}

// TestClassifyCleansLaneText: what the lane wrote reaches the error and its report as
// printable text, bounded.
func TestClassifyCleansLaneText(t *testing.T) {
	hostile := "bad\x1b[2J\n\xff" + strings.Repeat("x", 10_000)
	for _, x := range []Exit{
		{Status: 78, Fatal: hostile},
		{Status: 1, Tail: []string{hostile, hostile}},
		{Ready: true, Status: 2, Failure: "panic: " + hostile, Crash: []string{hostile}},
	} {
		e := Classify(x)
		texts := []string{e.Error()}
		var r *LaneReport
		if errors.As(e, &r) {
			texts = append(append(append(texts, r.Failure), r.Stack...), r.Tail...)
		}
		escaped := false
		for _, s := range texts {
			if strings.ContainsAny(s, "\n\x1b") || !utf8.ValidString(s) || len(s) > 4096 {
				t.Errorf("text not cleaned or not bounded (%d bytes): %.200q", len(s), s)
			}
			escaped = escaped || strings.Contains(s, `bad\x1b[2J\n\xff`)
		}
		if !escaped {
			t.Errorf("the escaped text was lost: %.200q", texts)
		}
	}
}

// Crash reports as Go 1.26 prints them.
const (
	faultReport = `unexpected fault address 0x7fd479c3d000
fatal error: fault
[signal SIGSEGV: segmentation violation code=0x2 addr=0x7fd479c3d000 pc=0x489ed9]

goroutine 1 gp=0x22bb9529c1e0 m=0 mp=0x5592c0 [running]:
runtime.throw({0x4aaeeb?, 0x0?})
	/usr/local/go/src/runtime/panic.go:1229 +0x48 fp=0x22bb95318e78 sp=0x22bb95318e48 pc=0x477be8
runtime.sigpanic()
	/usr/local/go/src/runtime/signal_unix.go:945 +0x285 fp=0x22bb95318ed8 sp=0x22bb95318e78 pc=0x478e45
main.fault()
	/tmp/crashgen/main.go:11 +0x39 fp=0x22bb95318f18 sp=0x22bb95318ed8 pc=0x489ed9
main.main()
	/tmp/crashgen/main.go:20 +0xd9 fp=0x22bb95318f48 sp=0x22bb95318f18 pc=0x489fd9
runtime.main()
	/usr/local/go/src/runtime/proc.go:290 +0x2d5 fp=0x22bb95318fe0 sp=0x22bb95318f48 pc=0x447ad5
runtime.goexit({})
	/usr/local/go/src/runtime/asm_amd64.s:1771 +0x1 fp=0x22bb95318fe8 sp=0x22bb95318fe0 pc=0x47d7c1

goroutine 2 gp=0x22bb9529c780 m=nil [force gc (idle)]:
runtime.gopark(0x0?, 0x0?, 0x0?, 0x0?, 0x0?)
	/usr/local/go/src/runtime/proc.go:462 +0xce fp=0x22bb952d2fa8 sp=0x22bb952d2f88 pc=0x477cce
created by runtime.init.7 in goroutine 1
	/usr/local/go/src/runtime/proc.go:363 +0x1a

goroutine 9 [select]:
github.com/knitgo/knit/lifecycle.(*abortWatch).run()
	/k/lifecycle/boot.go:280 +0x1a
`
	goPanicReport = `some output first
panic: lost

goroutine 20 [running]:
main.main.func2()
	/tmp/crashgen/main.go:26 +0x25
created by main.main in goroutine 1
	/tmp/crashgen/main.go:26 +0x70

goroutine 1 [chan receive]:
main.main()
	/tmp/crashgen/main.go:27 +0x99
`
)

const oomReport = `fatal error: runtime: out of memory

runtime stack:
runtime.throw({0x4923d2?, 0x60000000?})
	/usr/local/go/src/runtime/panic.go:1229 +0x48 fp=0x7ffefd9e2ae0 sp=0x7ffefd9e2ab0 pc=0x472188
runtime.sysMapOS(0x7f2658265000, 0x1000, {0x4905a0, 0xa})
	/usr/local/go/src/runtime/mem_linux.go:175 +0x13b fp=0x7ffefd9e2b20 sp=0x7ffefd9e2ae0 pc=0x41fa7b
runtime.sysMap(0x7f2658265000, 0x1000, 0x5dc00000?, {0x4905a0, 0xa})
	/usr/local/go/src/runtime/mem.go:279 +0x45 fp=0x7ffefd9e2b50 sp=0x7ffefd9e2b20 pc=0x41f305
runtime.(*pageAlloc).sysGrow(0x52d6e8, 0x1a325b000000, 0x1a32b8c00000)
	/usr/local/go/src/runtime/mpagealloc_64bit.go:179 +0x3b1 fp=0x7ffefd9e2bc8 sp=0x7ffefd9e2b50 pc=0x438c11
runtime.(*pageAlloc).grow(0x52d6e8, 0x5dc00000?, 0x5dc00000)
	/usr/local/go/src/runtime/mpagealloc.go:374 +0x69 fp=0x7ffefd9e2c40 sp=0x7ffefd9e2bc8 pc=0x4360e9
runtime.(*mheap).grow(0x52d6e0?, 0x2ee00?)
	/usr/local/go/src/runtime/mheap.go:1644 +0x2fc fp=0x7ffefd9e2cd0 sp=0x7ffefd9e2c40 pc=0x4340fc
runtime.(*mheap).allocSpan(0x52d6e0, 0x2ee00, 0x0, 0x1)
	/usr/local/go/src/runtime/mheap.go:1299 +0x1b3 fp=0x7ffefd9e2d80 sp=0x7ffefd9e2cd0 pc=0x433653
runtime.(*mheap).alloc.func1()
	/usr/local/go/src/runtime/mheap.go:1017 +0x5c fp=0x7ffefd9e2dc8 sp=0x7ffefd9e2d80 pc=0x43311c
runtime.systemstack(0x47985f)
	/usr/local/go/src/runtime/asm_amd64.s:562 +0x4a fp=0x7ffefd9e2dd8 sp=0x7ffefd9e2dc8 pc=0x475b2a

goroutine 1 gp=0x1a325ae701e0 m=0 mp=0x5256a0 [running]:
runtime.systemstack_switch()
	/usr/local/go/src/runtime/asm_amd64.s:516 +0x8 fp=0x1a325aea45d8 sp=0x1a325aea45c8 pc=0x475ac8
runtime.mallocgc(0x5dc00000, 0x481260, 0x1)
	/usr/local/go/src/runtime/malloc.go:1156 +0xd3 fp=0x1a325aea46f8 sp=0x1a325aea46c8 pc=0x4716b3
main.main()
	/tmp/crashgen/main.go:4 +0x25 fp=0x1a325aea4748 sp=0x1a325aea4720 pc=0x47a765
runtime.main()
	/usr/local/go/src/runtime/proc.go:290 +0x2d5 fp=0x1a325aea47e0 sp=0x1a325aea4748 pc=0x443ef5
`

// cgoAbortReport is the start of what a cgo-linked Go program printed when glibc could not
// map a new thread's stack under RLIMIT_DATA.
const cgoAbortReport = `runtime/cgo: pthread_create failed: Resource temporarily unavailable
SIGABRT: abort
PC=0x7f5134051eec m=2 sigcode=18446744073709551610

goroutine 0 gp=0x34eb41616b40 m=2 mp=0x34eb41650808 [idle]:
runtime: g 0 gp=0x34eb41616b40: unknown pc 0x7f5134051eec
stack: frame={sp:0x7f50ed35e8c0, fp:0x0} stack=[0x7f50ecb5f260,0x7f50ed35ee60)
00007f50ed35e7c0: 942f04c0 942f04c0  942f04c0 942f04c0  ../.../.../.../.
`

func TestCrashReport(t *testing.T) {
	cases := []struct {
		name, report, failure string
		crash                 []string
		logged                int // lines not in the dump
	}{
		{"fault", faultReport, "fatal error: fault", []string{
			"[signal SIGSEGV: segmentation violation code=0x2 addr=0x7fd479c3d000 pc=0x489ed9]",
			"goroutine 1 [running]:",
			"main.fault() at /tmp/crashgen/main.go:11",
			"main.main() at /tmp/crashgen/main.go:20",
		}, 2},
		{"goroutine panic", goPanicReport, "panic: lost", []string{
			"goroutine 20 [running]:",
			"main.main.func2() at /tmp/crashgen/main.go:26",
			"created by main.main in goroutine 1 at /tmp/crashgen/main.go:26",
		}, 2},
		{"no crash", "hello\nworld\n", "", nil, 2},
		{"fatal error on the system stack", oomReport, "fatal error: runtime: out of memory", []string{
			"goroutine 1 [running]:", "main.main() at /tmp/crashgen/main.go:4"}, 1},
		{"arguments", "panic: x\n\ngoroutine 5 [running]:\npkg.(*T[...]).f(0xc000, {0x1, 0x2})\n\t/p.go:3 +0x1\n",
			"panic: x", []string{"goroutine 5 [running]:", "pkg.(*T[...]).f(…) at /p.go:3"}, 1},
		{"cgo aborts", cgoAbortReport, "runtime/cgo: pthread_create failed: Resource temporarily unavailable",
			[]string{"SIGABRT: abort", "goroutine 0 [idle]:"}, 0},
		{"the runtime dies of a signal", "SIGQUIT: quit\nPC=0x4711 m=0 sigcode=0\n\ngoroutine 0 gp=0x1 m=0 mp=0x2 [idle]:\nruntime.futex(…)\n\t/r.go:1 +0x1\n",
			"SIGQUIT: quit", []string{"goroutine 0 [idle]:", "runtime.futex(…) at /r.go:1"}, 0},
		{"a line that only looks like one", "panic: not really\n" + strings.Repeat("more output\n", 20) + "panic: real\n\ngoroutine 3 [running]:\nmain.f()\n\t/m.go:1 +0x1\n",
			"panic: real", []string{"goroutine 3 [running]:", "main.f() at /m.go:1"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c CrashReport
			logged := 0
			for _, l := range strings.Split(strings.TrimSuffix(tc.report, "\n"), "\n") {
				if !c.Line(l) {
					logged++
				}
			}
			if c.Failure() != tc.failure {
				t.Errorf("failure %q, want %q", c.Failure(), tc.failure)
			}
			if got := c.Crash(); strings.Join(got, "\n") != strings.Join(tc.crash, "\n") {
				t.Errorf("crash\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.crash, "\n"))
			}
			if tc.logged > 0 && logged != tc.logged {
				t.Errorf("%d lines outside the dump, want %d", logged, tc.logged)
			}
		})
	}
}

func FuzzCrashReport(f *testing.F) {
	f.Add(faultReport)
	f.Add(goPanicReport)
	f.Fuzz(func(t *testing.T, s string) {
		var c CrashReport
		for _, l := range strings.Split(s, "\n") {
			c.Line(l)
		}
		if n := len(c.Crash()); n > maxFrames+2 {
			t.Fatalf("%d crash lines", n)
		}
		_ = Classify(Exit{Ready: true, Status: 2, Failure: c.Failure(), Crash: c.Crash()}).Error()
	})
}

func TestClassifyReturn(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		name     string
		stopping bool
		err      error
		code     Code
		normal   bool
	}{
		{"stopped", true, nil, CodeThreadClosed, false},
		{"stopped with an error", true, boom, CodeThreadClosed, false},
		{"stopped by Goexit", true, ErrGoexit, CodeThreadClosed, false},
		{"Goexit", false, ErrGoexit, CodeWorkerExited, false},
		{"failed", false, boom, CodeWorkerCrashed, false},
		{"returned", false, nil, CodeWorkerExited, true},
	} {
		e, normal := ClassifyReturn(4, c.stopping, c.err)
		if e.Code != c.code || normal != c.normal || e.Lane != 4 {
			t.Errorf("%s: %v (lane %d), normal %v; want %s, %v", c.name, e, e.Lane, normal, c.code, c.normal)
		}
		if c.err != nil && c.err != ErrGoexit && !errors.Is(e, boom) {
			t.Errorf("%s: %v does not wrap the lane's error", c.name, e)
		}
	}
}
