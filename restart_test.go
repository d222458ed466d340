package knit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/knitgo/knit"
)

// Supervision (Config.Restart, restart.go): how lanes end, are restarted or given up, and
// what becomes of the calls they held.

// has reports whether es holds a transition to to.
func has(es []knit.Event, to knit.State) bool {
	for _, e := range es {
		if e.To == to {
			return true
		}
	}
	return false
}

// The OTP matrix: every restart type × every way lane 1 of 3 can end × every strategy gives
// the documented code and restart decision, and every call the lanes held settles.
func TestSupervisionMatrix(t *testing.T) {
	ways := []struct {
		how     string
		code    knit.Code
		restart map[knit.RestartType]bool
	}{
		{"clean close", knit.CodeThreadClosed, map[knit.RestartType]bool{}},
		{"exit 0", knit.CodeWorkerExited, map[knit.RestartType]bool{knit.Permanent: true}},
		{"exit 3", knit.CodeWorkerExited, map[knit.RestartType]bool{knit.Permanent: true, knit.Transient: true}},
		{"task panic", knit.CodeWorkerCrashed, map[knit.RestartType]bool{knit.Permanent: true, knit.Transient: true}},
		{"runtime panic", knit.CodeWorkerCrashed, map[knit.RestartType]bool{knit.Permanent: true, knit.Transient: true}},
		{"SIGSEGV", knit.CodeWorkerCrashed, map[knit.RestartType]bool{knit.Permanent: true, knit.Transient: true}},
		{"SIGKILL", knit.CodeWorkerCrashed, map[knit.RestartType]bool{knit.Permanent: true, knit.Transient: true}},
		{"startup failure", knit.CodeStartupFailed, map[knit.RestartType]bool{knit.Permanent: true, knit.Transient: true}},
		{"hard timeout", knit.CodeWorkerCrashed, map[knit.RestartType]bool{knit.Permanent: true, knit.Transient: true}},
	}
	types := []knit.RestartType{knit.Permanent, knit.Transient, knit.Temporary}
	strategies := []knit.Strategy{knit.OneForOne, knit.AllForOne, knit.RestForOne}
	for _, way := range ways {
		for _, typ := range types {
			for _, strat := range strategies {
				t.Run(fmt.Sprintf("%s/%v/%v", way.how, typ, strat), func(t *testing.T) {
					if way.how == "startup failure" && typ == knit.Temporary {
						t.Skip("a temporary lane is never restarted, so it never boots again to fail; a first boot that fails fails NewPool (TestProcessStartupFailures)")
					}
					matrixCase(t, way.how, way.code, way.restart[typ], typ, strat)
				})
			}
		}
	}
}

func matrixCase(t *testing.T, how string, code knit.Code, restart bool, typ knit.RestartType, strat knit.Strategy) {
	spares := 0 // restarts take a spare process
	if how == "startup failure" {
		spares = -1 // the failure is injected at init, from the boot record a spare lacks then
	}
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	bootFail := filepath.Join(dir, "bootfail")
	t.Setenv("KNIT_TEST_BOOTFAIL", bootFail)
	rec := newRecorder()
	p, err := knit.NewPool(knit.Config{
		Lanes: 3, Runtime: knit.Process, PanicCrashesLane: true, Logger: zap.NewNop(),
		KillGrace: 200 * time.Millisecond, OnEvent: rec.record, Balancer: knit.RoundRobin,
		Restart: knit.Restart{Type: typ, Strategy: strat, Backoff: knit.Backoff{Min: -1}},
		Process: knit.ProcessConfig{Spares: spares},
	}, supTasks...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	pid1 := p.Stats().Lanes[1].PID

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The trigger goes first (round-robin: one to each lane), the held calls queue behind.
	in := trigger{Gate: gate, How: how}
	var triggers []*knit.Future[int]
	gated := how != "clean close" && how != "SIGKILL" && how != "startup failure"
	if gated {
		for range 3 {
			if how == "hard timeout" {
				triggers = append(triggers, hung.Go(ctx, p, in))
			} else {
				triggers = append(triggers, endLane.Go(ctx, p, in))
			}
		}
	}
	var heldCalls []*knit.Future[int]
	for range 6 {
		heldCalls = append(heldCalls, sleepy.Go(ctx, p, 0))
	}
	ended := func(e knit.Event) bool {
		return e.Lane == 1 && (e.To == knit.StateCrashed || e.To == knit.StateExited || e.To == knit.StateStartupFailed || e.To == knit.StateClosed)
	}
	switch how {
	case "clean close":
		now, stop := context.WithCancel(context.Background())
		stop() // no drain: the held calls never finish
		// The held calls settle THREAD_CLOSED as their lanes stop (killed if need be):
		// everything ended, so Close succeeds.
		if err := p.Close(now); err != nil {
			t.Errorf("Close: %v, want nil: every lane ended and every call settled", err)
		}
	case "SIGKILL", "startup failure":
		if how == "startup failure" {
			if err := os.WriteFile(bootFail, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			ended = func(e knit.Event) bool { return e.Lane == 1 && e.To == knit.StateStartupFailed }
		}
		if err := syscall.Kill(pid1, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	default:
		fifoWrite(t, gate, "opening lane 1's gate") // lane 1 goes
	}

	end := rec.await(t, "lane 1 ended", ended)
	if end.Code != code {
		t.Fatalf("lane 1 ended %v with %s (%s), want %s", end.To, end.Code, end.Reason, code)
	}
	decided := rec.await(t, "decision on lane 1", func(e knit.Event) bool {
		return e.Lane == 1 && e.Incarnation == end.Incarnation && (e.To == knit.StateRestarting || e.To == knit.StateDead || e.To == knit.StateClosed && how == "clean close")
	})
	if got := decided.To == knit.StateRestarting; got != restart {
		t.Fatalf("lane 1 after %s: %v (%s), want restart=%v", how, decided.To, decided.Reason, restart)
	}
	if how == "startup failure" {
		_ = os.Remove(bootFail)
	}
	if restart {
		rec.await(t, "lane 1 back", func(e knit.Event) bool {
			return e.Lane == 1 && e.To == knit.StateReady && e.Incarnation > end.Incarnation
		})
		for _, sib := range []int{0, 2} {
			want := strat == knit.AllForOne || strat == knit.RestForOne && sib > 1
			if want {
				rec.await(t, "sibling back", func(e knit.Event) bool { return e.Lane == sib && e.To == knit.StateReady && e.Incarnation > 0 })
			}
			if got := has(rec.events(sib), knit.StateStopping); got != want {
				t.Errorf("lane %d stopped with lane 1 under %v: %v, want %v", sib, strat, got, want)
			}
		}
	} else if how != "clean close" {
		for _, sib := range []int{0, 2} {
			if es := rec.events(sib); has(es, knit.StateStopping) || len(es) != 2 {
				t.Errorf("lane %d disturbed although lane 1 was not restarted: %v", sib, es)
			}
		}
	}
	cancel()
	for i, f := range append(heldCalls, triggers...) {
		_, err := f.Wait()
		var ke *knit.Error
		if err == nil || !errors.As(err, &ke) {
			if i < len(heldCalls) || err != nil {
				t.Errorf("call %d settled with %v", i, err)
			}
			continue
		}
		if ke.Lane == 1 && ke.Code != code && how != "clean close" && how != "startup failure" {
			t.Errorf("call %d held by lane 1 settled with %v, want %s", i, err, code)
		}
	}
	if restart { // the pool serves again
		for i := range 3 {
			if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 2}); err != nil || sum != int64(i)+2 {
				t.Errorf("call after the restart: %d, %v", sum, err)
			}
		}
	}
	if err := p.Close(context.Background()); err != nil && how != "clean close" {
		t.Logf("close: %v", err)
	}
	for i := range 3 {
		for _, e := range rec.events(i) {
			if e.To == knit.StateRestarting && how == "clean close" {
				t.Errorf("lane %d restarted during Close", i)
			}
		}
	}
}

func TestLaneIgnoringStopIsKilledAndClosed(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "started")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	p, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: knit.Process, Logger: zap.NewNop(),
		KillGrace: 100 * time.Millisecond, OnEvent: rec.record}, supTasks...)
	if err != nil {
		t.Fatal(err)
	}
	f := stubborn.Go(context.Background(), p, fifo)
	fifoRead(t, fifo, "the stubborn call starting") // the lane now ignores SIGTERM
	now, stop := context.WithCancel(context.Background())
	stop()
	err = p.Close(now)
	if err != nil {
		t.Errorf("Close: %v, want nil: the lane was killed, so it ended, and its call settled", err)
	}
	if _, err := f.Wait(); !errors.Is(err, knit.ErrThreadClosed) || !strings.Contains(err.Error(), "SIGKILL") {
		t.Errorf("held call: %v, want THREAD_CLOSED after SIGKILL", err)
	}
	es := rec.events(0)
	if last := es[len(es)-1]; last.To != knit.StateClosed || last.Code != knit.CodeThreadClosed {
		t.Errorf("lane ended %+v", last)
	}
}

// Under the explicit OTP policy (OnIntensity: GiveUp), a lane that crashes in a loop is given
// up after MaxRestarts in Period, with a backoff that doubles up to its cap; with no lane left
// the pool fails, tells its parent and refuses calls.
func TestRestartIntensity(t *testing.T) {
	bootFail := filepath.Join(t.TempDir(), "bootfail")
	if err := os.WriteFile(bootFail, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KNIT_TEST_BOOTFAIL", bootFail)
	t.Setenv("KNIT_TEST_BOOTFAIL_ANY", "1")
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	defer sys.Shutdown()
	told := make(chan *knit.PoolFailed, 1)
	parent := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*knit.PoolFailed); ok {
			told <- m
		}
	}))
	defer func() { _ = sys.Root.StopFuture(parent).Wait() }()
	rec := newRecorder()
	p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Process, Logger: zap.NewNop(), OnEvent: rec.record,
		ActorSystem: sys, Parent: parent, Process: knit.ProcessConfig{Spares: -1}, // failures injected at init
		Restart: knit.Restart{MaxRestarts: 5, Period: time.Hour, OnIntensity: knit.GiveUp,
			Backoff: knit.Backoff{Min: time.Millisecond, Max: 4 * time.Millisecond, Jitter: -1}}}, supTasks...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	for _, l := range p.Stats().Lanes {
		if err := syscall.Kill(l.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	rec.await(t, "pool failed", func(e knit.Event) bool { return e.Lane == -1 && e.To == knit.StateFailed })
	want := "[1ms 2ms 4ms 4ms 4ms]"
	for lane := range 2 {
		// The pool's failure and each lane's death are told from different goroutines: the
		// pool's event may come first. A lane's own events come in order, so its restarts
		// are all recorded once its death is.
		rec.await(t, fmt.Sprintf("lane %d dead", lane), func(e knit.Event) bool { return e.Lane == lane && e.To == knit.StateDead })
		var delays []time.Duration
		var dead *knit.Event
		for _, e := range rec.events(lane) {
			switch e.To {
			case knit.StateRestarting:
				delays = append(delays, e.Delay)
			case knit.StateDead:
				dead = &e
			}
		}
		if fmt.Sprint(delays) != want {
			t.Errorf("lane %d backoff schedule %v, want %s", lane, delays, want)
		}
		if dead == nil || !strings.Contains(dead.Reason, "intensity") {
			t.Errorf("lane %d not given up for intensity: %+v", lane, dead)
		}
	}
	if _, err := add.Call(context.Background(), p, [2]int64{1, 2}); !errors.Is(err, knit.ErrPoolUnavailable) {
		t.Errorf("call on a failed pool: %v, want POOL_UNAVAILABLE", err)
	}
	m := <-told
	if !m.Pool.Equal(p.PID()) || !errors.Is(m.Err, knit.ErrPoolUnavailable) {
		t.Errorf("parent told %+v", m)
	}
	if s := p.Stats(); !s.Failed || s.Lanes[0].State != knit.StateDead {
		t.Errorf("stats %+v", s)
	}
}

// Under the default policy the same crash loop never costs the pool: past MaxRestarts the
// lanes are in crash-loop backoff (logged at Error, shown in Stats), their delays doubling to
// CrashLoopMax, and once restarts boot again they serve.
func TestCrashLoopKeepsPool(t *testing.T) {
	bootFail := filepath.Join(t.TempDir(), "bootfail")
	if err := os.WriteFile(bootFail, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KNIT_TEST_BOOTFAIL", bootFail)
	t.Setenv("KNIT_TEST_BOOTFAIL_ANY", "1")
	core, logs := observer.New(zapcore.ErrorLevel)
	rec := newRecorder()
	p, err := knit.NewPool(knit.Config{Lanes: 2, Runtime: knit.Process, Logger: zap.New(core), OnEvent: rec.record,
		Process: knit.ProcessConfig{Spares: -1}, // failures injected at init
		Restart: knit.Restart{MaxRestarts: 2, Period: time.Hour,
			Backoff: knit.Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond, CrashLoopMax: 8 * time.Millisecond, Jitter: -1}}}, supTasks...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	for _, l := range p.Stats().Lanes {
		if err := syscall.Kill(l.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for lane := range 2 {
		rec.await(t, "crash-loop backoff at its cap", func(e knit.Event) bool {
			return e.Lane == lane && e.To == knit.StateCrashLoopBackoff && e.Delay == 8*time.Millisecond
		})
	}
	if err := os.Remove(bootFail); err != nil {
		t.Fatal(err)
	}
	for lane := range 2 {
		var delays []time.Duration
		for _, e := range rec.events(lane) {
			if e.To == knit.StateRestarting || e.To == knit.StateCrashLoopBackoff {
				delays = append(delays, e.Delay)
			}
		}
		if want := "[1ms 2ms 4ms 8ms]"; fmt.Sprint(delays[:4]) != want {
			t.Errorf("lane %d backoff schedule %v, want %s then 8ms", lane, delays, want)
		}
		rec.await(t, "lane back", func(e knit.Event) bool { return e.Lane == lane && e.To == knit.StateReady && e.Incarnation > 0 })
	}
	for i := range 4 {
		if sum, err := add.Call(context.Background(), p, [2]int64{int64(i), 2}); err != nil || sum != int64(i)+2 {
			t.Errorf("call after the crash loop: %d, %v", sum, err)
		}
	}
	if has(rec.events(-1), knit.StateFailed) || has(rec.events(0), knit.StateDead) || has(rec.events(1), knit.StateDead) || p.Stats().Failed {
		t.Errorf("a crash loop cost the pool: %+v", p.Stats())
	}
	if n := logs.FilterMessage("lane crash_loop_backoff").Len(); n < 4 {
		t.Errorf("%d crash-loop backoffs logged at Error, want one per crash-looping restart", n)
	}
}

// Chaos: 4 process lanes serve 200,000 calls from 32 goroutines while lanes are SIGKILLed at
// random. Every call settles, with its result or a coded error; Idempotent calls all succeed;
// the pool ends with 4 ready lanes and leaves nothing behind.
func TestChaos(t *testing.T) {
	calls, kills := 200_000, 12
	if testing.Short() {
		calls, kills = 20_000, 4
	}
	before := shmNames(t)
	rec := newRecorder()
	p, err := knit.NewPool(knit.Config{Lanes: 4, Runtime: knit.Process, Logger: zap.NewNop(), OnEvent: rec.record,
		Restart: knit.Restart{MaxRestarts: -1, Backoff: knit.Backoff{Min: time.Millisecond, Max: 10 * time.Millisecond}}}, supTasks...)
	if err != nil {
		t.Fatal(err)
	}
	pids := &lanePIDs{}
	notePIDs := func() { pids.note(p) }
	notePIDs()

	var done, idemFailed, coded atomic.Int64
	var wrong atomic.Value
	killAt := make(chan struct{}, kills)
	var wg sync.WaitGroup
	per := calls / 32
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				a, b := int64(g), int64(i)
				var sum int64
				var err error
				idem := i%2 == 0
				if idem {
					sum, err = idemAdd.Call(context.Background(), p, [2]int64{a, b})
				} else {
					sum, err = add.Call(context.Background(), p, [2]int64{a, b})
				}
				var ke *knit.Error
				switch {
				case err == nil && sum != a+b:
					wrong.Store(fmt.Sprintf("%d+%d = %d", a, b, sum))
				case err != nil && idem:
					idemFailed.Add(1)
					wrong.Store(fmt.Sprintf("idempotent call failed: %v", err))
				case err != nil && !errors.As(err, &ke):
					wrong.Store(fmt.Sprintf("uncoded error: %v", err))
				case err != nil:
					coded.Add(1)
				}
				if n := done.Add(1); n%int64(calls/(kills+1)) == 0 {
					select {
					case killAt <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	killed := 0
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	for loop := true; loop; {
		select {
		case <-killAt:
			if killed == kills {
				continue
			}
			notePIDs()
			lanes := p.Stats().Lanes
			if l := lanes[rand.N(len(lanes))]; l.PID > 0 && l.State == knit.StateReady {
				_ = syscall.Kill(l.PID, syscall.SIGKILL)
				killed++
			}
		case <-finished:
			loop = false
		}
	}
	if w := wrong.Load(); w != nil {
		t.Fatalf("%v (idempotent failures %d)", w, idemFailed.Load())
	}
	t.Logf("%d calls, %d lanes killed, %d non-idempotent calls failed with a coded error", done.Load(), killed, coded.Load())
	if killed == 0 {
		t.Error("no lane was killed")
	}
	// The pool ends with 4 ready lanes: every restart reports its transitions.
	rec.mu.Lock()
	for !allReady(p) {
		rec.cond.Wait()
	}
	rec.mu.Unlock()
	notePIDs()
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	pids.checkGone(t)
	if after := shmNames(t); len(after) > len(before) {
		t.Errorf("named mappings left: %v", after)
	}
	maps, _ := os.ReadFile("/proc/self/maps")
	if strings.Contains(string(maps), "knit-lane") {
		t.Error("a lane region is still mapped after Close")
	}
}

// A restart takes the spare process the pool keeps started; a new spare replaces it.
func TestRestartTakesSpare(t *testing.T) {
	rec := newRecorder()
	// A startup timeout that never expires: Close must not wait on a spare that is still
	// initialising (as it does right after the second restart below), it kills it.
	p, err := knit.NewPool(knit.Config{Lanes: 1, Runtime: knit.Process, Logger: zap.NewNop(), OnEvent: rec.record,
		StartupTimeout: time.Hour}, supTasks...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	knit.AwaitSpares(p)
	spares := p.Stats().Spares
	if len(spares) != 1 {
		t.Fatalf("spares %v, want one", spares)
	}
	old := p.Stats().Lanes[0].PID
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec.await(t, "restart", func(e knit.Event) bool { return e.To == knit.StateReady && e.Incarnation == 1 })
	if sum, err := add.Call(context.Background(), p, [2]int64{1, 2}); err != nil || sum != 3 {
		t.Fatalf("call after the restart: %d, %v", sum, err)
	}
	if l := p.Stats().Lanes[0]; l.PID != spares[0] || l.Incarnation != 1 {
		t.Fatalf("restarted lane %+v, want the spare %d", l, spares[0])
	}
	knit.AwaitSpares(p)
	if s := p.Stats().Spares; len(s) != 1 || s[0] == spares[0] {
		t.Fatalf("spares after the restart %v", s)
	}
	// A spare that died waiting is passed over: the restart spawns a process.
	dead := p.Stats().Spares[0]
	if err := syscall.Kill(dead, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.Stats().Lanes[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// (Incarnation 2, or 3 should the dying spare have been taken and failed to boot.)
	rec.await(t, "second restart", func(e knit.Event) bool { return e.To == knit.StateReady && e.Incarnation >= 2 })
	if sum, err := add.Call(context.Background(), p, [2]int64{2, 2}); err != nil || sum != 4 {
		t.Fatalf("call after the second restart: %d, %v", sum, err)
	}
	if l := p.Stats().Lanes[0]; l.PID == dead || l.Incarnation < 2 {
		t.Fatalf("lane %+v took the dead spare %d", l, dead)
	}
}

func TestGoexitEndsLane(t *testing.T) {
	// Transient (default): an exit without a stop request is abnormal and the lane comes
	// back as incarnation 1; the next call waits for it.
	p := newPool(t, knit.Config{Lanes: 1})
	_, err := goexit.Call(context.Background(), p, 1)
	if !errors.Is(err, knit.ErrWorkerExited) {
		t.Fatalf("err = %v, want WORKER_EXITED", err)
	}
	if _, err := add.Call(context.Background(), p, [2]int64{}); err != nil {
		t.Fatalf("call after the restart: %v", err)
	}
	// The new incarnation takes calls a moment before its ready event is reported.
	for e := range p.Events() {
		if e.Lane == 0 && e.To == knit.StateReady && e.Incarnation == 1 {
			break
		}
	}
	if s := p.Stats().Lanes[0]; s.State != knit.StateReady || s.Incarnation != 1 || s.Restarts != 1 {
		t.Fatalf("lane after restart: %+v", s)
	}

	// Temporary: the lane is not restarted, the pool has none left and says so.
	p = newPool(t, knit.Config{Lanes: 1, Restart: knit.Restart{Type: knit.Temporary}})
	if _, err := goexit.Call(context.Background(), p, 1); !errors.Is(err, knit.ErrWorkerExited) {
		t.Fatalf("err = %v, want WORKER_EXITED", err)
	}
	for e := range p.Events() {
		if e.Lane == -1 && e.To == knit.StateFailed {
			break
		}
	}
	if _, err := add.Call(context.Background(), p, [2]int64{}); !errors.Is(err, knit.ErrPoolUnavailable) {
		t.Fatalf("call on a pool with no live lane: %v, want ErrPoolUnavailable", err)
	}
	if s := p.Stats(); s.Lanes[0].State != knit.StateDead || !s.Failed {
		t.Fatalf("stats %+v", s)
	}
}

// A goroutine lane that crashes (PanicCrashesLane) is restarted; the Idempotent calls it held
// run again on the new incarnation, the others settle with WORKER_CRASHED.
func TestCrashedGoroutineLaneRestartsAndReRunsIdempotentCalls(t *testing.T) {
	var events []knit.Event
	var mu sync.Mutex
	p, err := knit.NewPool(knit.Config{Lanes: 1, PanicCrashesLane: true, OnEvent: func(e knit.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}}, gatedPanic, idemDouble, plainTwice)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	g := newGate()
	crash := gatedPanic.Go(context.Background(), p, g)
	<-g.started
	var idem, plain []*knit.Future[int]
	for i := range 10 {
		idem = append(idem, idemDouble.Go(context.Background(), p, i))
		plain = append(plain, plainTwice.Go(context.Background(), p, i))
	}
	close(g.open)
	if _, err := crash.Wait(); !errors.Is(err, knit.ErrWorkerCrashed) {
		t.Fatalf("crashing call: %v", err)
	}
	for i, f := range idem {
		if v, err := f.Wait(); err != nil || v != 2*i {
			t.Errorf("idempotent call %d: %d, %v", i, v, err)
		}
	}
	for i, f := range plain {
		if v, err := f.Wait(); err != nil && !errors.Is(err, knit.ErrWorkerCrashed) || err == nil && v != 2*i {
			t.Errorf("plain call %d: %d, %v", i, v, err)
		}
	}
	if s := p.Stats().Lanes[0]; s.Incarnation != 1 || s.Restarts != 1 {
		t.Errorf("lane %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	var crashed bool
	for _, e := range events {
		crashed = crashed || e.To == knit.StateCrashed && e.Code == knit.CodeWorkerCrashed && e.Incarnation == 0
	}
	if !crashed {
		t.Errorf("no crashed event: %+v", events)
	}
}
