package knit_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/unix"

	"github.com/knitgo/knit"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/internal/futex"
	"github.com/knitgo/knit/internal/shm"
	"github.com/knitgo/knit/lifecycle"
	"github.com/knitgo/knit/steal"
)

// Tasks for the tests, benchmarks and examples of package knit, all in this file. A task is
// defined once, at package level, so that a process lane, which runs this same test binary
// (TestMain calls knit.Main), has every task the host has: the lane rebuilds the registry from
// the same definitions. Task names are what host and lanes match on: they must not change.
// Also here: what the tasks need (input types, codecs, counters), and the init functions
// that make a lane misbehave at boot when a test's environment asks for it.

// Basic tasks, for goroutine and process lanes.

var (
	add = knit.Define("test.add", func(_ context.Context, in [2]int64) (int64, error) {
		return in[0] + in[1], nil
	})
	echo = knit.Define("test.echo", func(_ context.Context, in []byte) ([]byte, error) { return in, nil })
	fail = knit.Define("test.fail", func(_ context.Context, msg string) (int, error) {
		return 0, errors.New(msg)
	})
	boom = knit.Define("test.panic", func(_ context.Context, msg string) (int, error) { panic(msg) })

	// block waits for a gate: it tells started, then returns when the gate opens or its
	// context ends (reporting which on ended).
	block = knit.Define("test.block", func(ctx context.Context, g *gate) (string, error) {
		g.started <- struct{}{}
		select {
		case <-g.open:
			return "opened", nil
		case <-ctx.Done():
			g.ended <- ctx.Err()
			return "", ctx.Err()
		}
	})
	blockTimeout = knit.Define("test.block.timeout", func(ctx context.Context, g *gate) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}, knit.Timeout(time.Millisecond))
	blockDefault = knit.Define("test.block.default", func(ctx context.Context, g *gate) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}, knit.TimeoutDefault(time.Millisecond, "fallback"))
	goexit = knit.Define("test.goexit", func(context.Context, int) (int, error) {
		runtime.Goexit()
		return 0, nil
	})
)

// gate lets a test hold a task inside a lane.
type gate struct {
	started chan struct{}
	open    chan struct{}
	ended   chan error
}

func newGate() *gate {
	return &gate{started: make(chan struct{}, 64), open: make(chan struct{}), ended: make(chan error, 64)}
}

// unserved is in no test pool.
var unserved = knit.Define("test.unserved", func(context.Context, int) (int, error) { return 0, nil })

var (
	idemDouble = knit.Define("test.idem.double", func(_ context.Context, n int) (int, error) { return 2 * n, nil }, knit.Idempotent())
	plainTwice = knit.Define("test.plain.double", func(_ context.Context, n int) (int, error) { return 2 * n, nil })
	gatedPanic = knit.Define("test.gated.panic", func(_ context.Context, g *gate) (int, error) {
		g.started <- struct{}{}
		<-g.open
		panic("crash the lane on purpose")
	})
)

// Process lanes: tasks that end their lane, or look around it.

var (
	sleepy = knit.Define("test.proc.sleep", func(ctx context.Context, _ int) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	exit3 = knit.Define("test.proc.exit", func(_ context.Context, code int) (int, error) {
		os.Exit(code)
		return 0, nil
	})
	goPanic = knit.Define("test.proc.gopanic", func(_ context.Context, msg string) (int, error) {
		done := make(chan struct{})
		go func() { panic(msg) }() // nobody can recover this one: the process dies
		<-done
		return 0, nil
	})
	// fault writes to a read-only page: a real SIGSEGV that the Go runtime cannot turn into
	// a recoverable panic.
	fault = knit.Define("test.proc.fault", func(_ context.Context, _ int) (int, error) {
		page, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return 0, err
		}
		page[0] = 1
		return 0, nil
	})
	environ = knit.Define("test.proc.environ", func(context.Context, int) ([]string, error) {
		return os.Environ(), nil
	})
	spawnChild = knit.Define("test.proc.spawn", func(context.Context, int) (int, error) {
		cmd := exec.Command("sleep", "1000")
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	nestedPool = knit.Define("test.proc.nested", func(context.Context, int) (string, error) {
		_, err := knit.NewPool(knit.Config{Lanes: 1}, add)
		if err == nil {
			return "", errors.New("NewPool succeeded inside a lane")
		}
		return err.Error(), nil
	})
	coded = knit.Define("test.proc.coded", func(context.Context, int) (int, error) {
		return 0, &knit.Error{Code: knit.CodeOverloaded, Lane: -1, Message: "try later"}
	})
	procTasks = []knit.Definition{add, echo, fail, boom, sleepy, exit3, goPanic, fault, environ, spawnChild, nestedPool, coded}
)

// running is a call that tells the test it runs (one byte into the FIFO it names), then
// waits for its context.
var running = knit.Define("test.proc.running", func(ctx context.Context, fifo string) (int, error) {
	if err := os.WriteFile(fifo, []byte{1}, 0o600); err != nil {
		return 0, err
	}
	<-ctx.Done()
	return 0, ctx.Err()
})

// A task whose definition depends on KNIT_TEST_VARIANT, which only lanes get (through
// Config.Process.Env): it lets a test build lanes whose registry does not match the host's.
var variant = defineVariant()

func defineVariant() knit.Definition {
	switch os.Getenv("KNIT_TEST_VARIANT") {
	case "mismatch":
		return knit.Define("test.variant", func(context.Context, string) (int, error) { return 0, nil })
	case "missing":
		return nil
	case "initpanic":
		panic("init failed on purpose")
	}
	return knit.Define("test.variant", func(context.Context, int) (int, error) { return 0, nil })
}

// The caller's context in a lane.

// deadlineOf reports the deadline a task's context carries, in Unix nanoseconds (0: none).
var deadlineOf = knit.Define("test.deadlineOf", func(ctx context.Context, _ int) (int64, error) {
	d, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	return d.UnixNano(), nil
})

// traceOf reports the trace id in a task's context ("" for none).
var traceOf = knit.Define("test.traceOf", func(ctx context.Context, _ int) (string, error) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String(), nil
	}
	return "", nil
})

// Codecs: values that cannot cross a process boundary, and lanes (KNIT_TEST_FORGE=1) whose
// codecs forge what they send or refuse what they get.

type cnode struct {
	Val  int
	Next *cnode
}

type hiddenField struct {
	Name   string
	secret int
}

var (
	bigResult = knit.Define("test.codec.big", func(_ context.Context, n int) ([]byte, error) {
		return make([]byte, n), nil
	})
	bigError = knit.Define("test.codec.bigerr", func(_ context.Context, n int) (int, error) {
		return 0, errors.New(strings.Repeat("e", n))
	})
	walkList = knit.Define("test.codec.list", func(_ context.Context, n *cnode) (int, error) {
		k := 0
		for ; n != nil && k < 1000; n = n.Next {
			k++
		}
		return k, nil
	})
	cyclicOut = knit.Define("test.codec.cyclicout", func(context.Context, int) (*cnode, error) {
		n := &cnode{Val: 1}
		n.Next = n
		return n, nil
	})
	deepAny = knit.Define("test.codec.deep", func(_ context.Context, v any) (int, error) { return 0, nil })
	hidden  = knit.Define("test.codec.hidden", func(_ context.Context, v hiddenField) (hiddenField, error) { return v, nil })
	// refuseOnLane's input codec fails to decode in lanes (KNIT_TEST_FORGE=1), as a user
	// codec that does not round-trip would.
	refuseOnLane = knit.Define("test.codec.refuse", func(context.Context, int) (int, error) { return 1, nil },
		knit.WithCodec(knit.Codec[int](laneRefuses{})))
	// forge's lanes (KNIT_TEST_FORGE=1) answer with forged CBOR: n empty byte strings,
	// which decode into [][8192]byte as n·8 KiB.
	forge = defineForge()
)

type laneRefuses struct{}

func (laneRefuses) Name() string                             { return "refuses" }
func (laneRefuses) Append(dst []byte, v int) ([]byte, error) { return append(dst, byte(v)), nil }
func (laneRefuses) Decode(b []byte) (int, error) {
	if os.Getenv("KNIT_TEST_FORGE") == "1" {
		return 0, errors.New("this lane refuses every input")
	}
	return int(b[0]), nil
}

// forgeCount is the number of empty byte strings the lane's next forged result holds: the
// task sets it, its codec reads it.
var forgeCount atomic.Int64

type forgedArrays struct{}

func (forgedArrays) Name() string { return "forged" }
func (forgedArrays) Append(dst []byte, _ [][8192]byte) ([]byte, error) {
	n := forgeCount.Load()
	dst = append(dst, 0x9a, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	return append(dst, bytes.Repeat([]byte{0x40}, int(n))...), nil
}
func (forgedArrays) Decode([]byte) ([][8192]byte, error) { return nil, errors.New("not used") }

func defineForge() *knit.Task[int, [][8192]byte] {
	if os.Getenv("KNIT_TEST_FORGE") == "1" {
		return knit.Define("test.codec.forge", func(_ context.Context, n int) ([][8192]byte, error) {
			forgeCount.Store(int64(n))
			return nil, nil
		}, knit.WithCodec(knit.Codec[[][8192]byte](forgedArrays{})))
	}
	return knit.Define("test.codec.forge", func(_ context.Context, n int) ([][8192]byte, error) {
		return make([][8192]byte, n), nil
	})
}

// forgeIn is the other direction: the host's input codec forges (lanes, with
// KNIT_TEST_FORGE=1, decode with plain CBOR), so the lane's decoder meets the forged payload.
var forgeIn = defineForgeIn()

type forgedInput struct{ forgedArrays }

func (forgedInput) Decode([]byte) ([][8192]byte, error) { return nil, errors.New("not used") }

func defineForgeIn() *knit.Task[[][8192]byte, int] {
	fn := func(_ context.Context, v [][8192]byte) (int, error) { return len(v), nil }
	if os.Getenv("KNIT_TEST_FORGE") == "1" {
		return knit.Define("test.codec.forgein", fn)
	}
	return knit.Define("test.codec.forgein", fn, knit.WithCodec(knit.Codec[[][8192]byte](forgedInput{})))
}

var codecTasks = []knit.Definition{add, bigResult, bigError, walkList, cyclicOut, deepAny, refuseOnLane, forge, forgeIn}

// Hostile lanes (docs/process-lanes.md, "Threat model"): each task below misbehaves on
// purpose, from inside a real lane process.

var (
	// freeze stops its own lane process (SIGSTOP): the lane neither ends nor answers. The
	// stop can take effect a while after kill returns (the signal waits in the process's
	// pending set for a thread to act on it: seen after 100+ µs here), so the task never
	// returns: returning would publish a result before the lane froze.
	freeze = knit.Define("test.hostile.freeze", func(context.Context, int) (int, error) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		select {}
	})
	// closeBell closes the completion doorbell's descriptor and replaces it with /dev/null,
	// then answers: its results are published, but the host is never rung for them.
	closeBell = knit.Define("test.hostile.closebell", func(context.Context, int) (int, error) {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return 0, err
		}
		defer null.Close()
		if err := syscall.Dup2(int(null.Fd()), 4); err != nil {
			return 0, err
		}
		return 7, nil
	})
	// forgeOther writes results into its own lane's return ring for calls it does not hold:
	// every record id below 64 of the victim task, in every generation below 8, with 666.
	forgeOther = knit.Define("test.hostile.forge", func(_ context.Context, victim uint32) (int, error) {
		f := os.NewFile(3, "region")
		mp, err := shm.MapFile(f)
		if err != nil {
			return 0, err
		}
		r, err := fastpath.OpenRegion(mp.Bytes())
		if err != nil {
			return 0, err
		}
		ret := r.Returns().Producer()
		forged := []byte{0x19, 0x02, 0x9a} // CBOR 666
		for id := uint32(0); id < 64; id++ {
			for gen := uint32(0); gen < 8; gen++ {
				i, ok := ret.Reserve()
				for !ok {
					i, ok = ret.Reserve()
				}
				buf, err := ret.Put(i, len(forged))
				if err != nil {
					return 0, err
				}
				copy(buf, forged)
				s := ret.Slot(i)
				s.SetFn(victim)
				s.SetCall(id, gen)
				s.SetAbort(0)
				s.SetFlags(0)
				ret.Publish(i)
			}
		}
		return 0, nil
	})
	// victim waits for its gate (a FIFO) and returns its input.
	victim = knit.Define("test.hostile.victim", func(_ context.Context, gate string) (int, error) {
		if _, err := os.ReadFile(gate); err != nil {
			return 0, err
		}
		return 42, nil
	})
	// overrun ignores its context and never returns.
	overrun = knit.Define("test.hostile.overrun", func(context.Context, int) (int, error) {
		select {}
	}, knit.HardTimeout(300*time.Millisecond))
)

// hostileText is what a hostile lane writes where the host will read it: a terminal escape
// sequence, a newline that would forge a log line, a byte that is not UTF-8, and bulk.
var hostileText = "\x1b[2J\x1b[31mforged\nWARN\tknit.lifecycle\tfake line\xff" + strings.Repeat("z", 2000)

var (
	// truncRegion resizes the lane's own region file: on an unsealed file, a size of 0 made
	// the host's next access to the region fault with SIGBUS.
	truncRegion = knit.Define("test.hostile.truncate", func(_ context.Context, size int64) (string, error) {
		return fmt.Sprint(unix.Ftruncate(lifecycle.RegionFD(), size)), nil
	})
	// spew writes lines to stderr as fast as it can.
	spew = knit.Define("test.hostile.spew", func(_ context.Context, lines int) (int, error) {
		w := bufio.NewWriterSize(os.Stderr, 64<<10)
		line := strings.Repeat("x", 100) + "\n"
		for range lines {
			w.WriteString(line)
		}
		return lines, w.Flush()
	})
	// scribble rewrites the lane's control block — boot word, fatal message, magic, all of
	// it — after the lane was ready, then exits with the given status.
	scribble = knit.Define("test.hostile.scribble", func(_ context.Context, status int) (int, error) {
		r, err := laneRegion()
		if err != nil {
			return 0, err
		}
		r.SetFatal(hostileText)
		r.Boot().Store(fastpath.BootFailed)
		ctrl := r.Bytes()[:1024]
		for i := range ctrl {
			ctrl[i] ^= 0xa5
		}
		os.Exit(status)
		return 0, nil
	})
	// runByName runs a program found through PATH.
	runByName = knit.Define("test.hostile.path", func(_ context.Context, name string) (string, error) {
		out, err := exec.Command(name, "-c", "echo found").Output()
		return strings.TrimSpace(string(out)), err
	})
	// hog allocates n bytes in 1 MiB pieces and keeps them until it returns. In pieces, not in
	// one slice: under RLIMIT_DATA the kernel lets the Go heap map one allocation however large
	// over address space the runtime reserved (see TestProcessPrefixMemoryLimit); growing
	// piece by piece, the runtime maps more metadata, which the limit refuses.
	hog = knit.Define("test.hostile.hog", func(_ context.Context, n int) (int, error) {
		var kept [][]byte
		total := 0
		for total < n {
			b := make([]byte, min(1<<20, n-total))
			kept = append(kept, b)
			total += len(b)
		}
		return total, nil
	})
	hostileTasks = []knit.Definition{add, truncRegion, spew, scribble, runByName, hog, fault}
)

// laneRegion maps the lane's own region a second time, as any code in a lane can.
func laneRegion() (*fastpath.Region, error) {
	fd, err := unix.Dup(lifecycle.FDRegion)
	if err != nil {
		return nil, err
	}
	mp, err := shm.MapFile(os.NewFile(uintptr(fd), "region"))
	if err != nil {
		return nil, err
	}
	return fastpath.OpenRegion(mp.Bytes())
}

// A lane that fails its boot with a hostile message: with KNIT_TEST_HOSTILE_BOOT in its
// environment, it leaves hostileText in its region's fatal area and on stderr, before
// knit.Main runs.
func init() {
	if os.Getenv("KNIT_TEST_HOSTILE_BOOT") == "" || os.Getenv(lifecycle.EnvBoot) == "" {
		return
	}
	r, err := laneRegion()
	if err != nil {
		os.Exit(1)
	}
	r.SetFatal(hostileText)
	fmt.Fprintln(os.Stderr, hostileText)
	os.Exit(lifecycle.ExitBoot)
}

// The region's layout, as a lane that reads its own control block finds it (fastpath's
// protocol: part offsets at byte 56, the inline size at byte 20, 256 bytes of ring control
// before a ring's slots, producer word first).
const (
	ctrlInline   = 20
	ctrlParts    = 56
	partRetRing  = 2
	partReqRing  = 1
	ringCtrlSize = 256
	headerTag    = 8
	headerOff    = 16
	headerLen    = 20
)

// partOffset is where part i of region r starts.
func partOffset(r *fastpath.Region, i int) int {
	return int(binary.LittleEndian.Uint32(r.Bytes()[ctrlParts+4*i:]))
}

// retHeader is the 64-byte header of return slot i of r, to write as no honest producer would.
func retHeader(r *fastpath.Region, i int) []byte {
	inline := int(binary.LittleEndian.Uint32(r.Bytes()[ctrlInline:]))
	off := partOffset(r, partRetRing) + ringCtrlSize + i*(fastpath.HeaderBytes+inline)
	return r.Bytes()[off : off+fastpath.HeaderBytes]
}

// ringBell writes the completion eventfd, as the lane's executor does after a result.
func ringBell() {
	one := [8]byte{1}
	_, _ = unix.Write(lifecycle.FDDone, one[:])
}

var (
	// scribbleAll writes random bytes over the whole of its lane's region — control block,
	// rings, arenas, heartbeat, running word — again and again, until the host kills it.
	scribbleAll = knit.Define("test.hostile.scribbleall", func(_ context.Context, seed uint64) (int, error) {
		r, err := laneRegion()
		if err != nil {
			return 0, err
		}
		mem := r.Bytes()
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		for {
			for i := 0; i+8 <= len(mem); i += 8 {
				binary.LittleEndian.PutUint64(mem[i:], rng.Uint64())
			}
		}
	})

	// forgeOwn writes results for its own call that break the protocol in the way mode
	// says (forgeModes), rings the host, waits until the host has taken them, then
	// returns its real result, 42.
	forgeOwn = knit.Define("test.hostile.forgeown", func(_ context.Context, mode string) (int, error) {
		r, err := laneRegion()
		if err != nil {
			return 0, err
		}
		fn, id, gen, abort, err := ownCall(r)
		if err != nil {
			return 0, err
		}
		ret := r.Returns().Producer()
		forge := func(set func(s fastpath.Slot, h []byte)) {
			i, ok := ret.Reserve()
			for !ok {
				i, ok = ret.Reserve()
			}
			buf, _ := ret.Put(i, 8)
			binary.LittleEndian.PutUint64(buf, 666)
			s := ret.Slot(i)
			s.SetFn(fn)
			s.SetCall(id, gen)
			s.SetAbort(abort)
			s.SetFlags(0)
			set(s, retHeader(r, i))
			ret.Publish(i)
		}
		put32 := binary.LittleEndian.PutUint32
		switch mode {
		case "tag":
			forge(func(_ fastpath.Slot, h []byte) { put32(h[headerTag:], 9) })
		case "offset":
			forge(func(_ fastpath.Slot, h []byte) {
				put32(h[headerTag:], fastpath.TagArena)
				put32(h[headerOff:], 13) // not 64-aligned
			})
		case "arena-end":
			forge(func(_ fastpath.Slot, h []byte) {
				put32(h[headerTag:], fastpath.TagArena)
				put32(h[headerOff:], 0xffffffc0)
				put32(h[headerLen:], 0x7fffffff)
			})
		case "length":
			forge(func(_ fastpath.Slot, h []byte) { put32(h[headerLen:], fastpath.HeaderData+1) })
		case "inline-length":
			forge(func(_ fastpath.Slot, h []byte) {
				put32(h[headerTag:], fastpath.TagInline)
				put32(h[headerLen:], 1<<20)
			})
		case "function":
			forge(func(s fastpath.Slot, _ []byte) { s.SetFn(0xffffffff) })
		case "unserved":
			forge(func(s fastpath.Slot, _ []byte) { s.SetFn(knit.TaskIndex(unserved)) })
		case "other-task":
			forge(func(s fastpath.Slot, _ []byte) { s.SetFn(knit.TaskIndex(add)) })
		case "generation":
			forge(func(s fastpath.Slot, _ []byte) { s.SetCall(id, gen+1) })
		case "abort-bit":
			forge(func(s fastpath.Slot, _ []byte) { s.SetAbort(abort + 2) })
		case "abort-range":
			forge(func(s fastpath.Slot, _ []byte) { s.SetAbort(0xffff) })
		case "duplicate":
			forge(func(fastpath.Slot, []byte) {})
			forge(func(fastpath.Slot, []byte) {})
		case "outcome":
			forge(func(s fastpath.Slot, _ []byte) { s.SetFlags(77) })
		default:
			return 0, errors.New("unknown mode " + mode)
		}
		ringBell()
		// The host takes the forged results (and kills the lane for most of them) before
		// the executor publishes the real one.
		for r.Returns().Consumer().Peek() != 0 {
			time.Sleep(time.Millisecond)
		}
		if mode == "outcome" {
			// A result with an unknown outcome fails its call ("lane broke the protocol")
			// and the lane lives, but its executor's view of the return ring is now stale:
			// its next result could wait for a slot forever. This lane leaves.
			os.Exit(3)
		}
		return 42, nil
	})

	// storm rings the host's completion eventfd, wakes every futex word of the region, flips
	// the completion arm word through all its states and rewrites its own ring words with
	// their current values, as fast as it can, until the FIFO gate can be read. It tells the
	// FIFO started once the storm runs, and returns 42.
	storm = knit.Define("test.hostile.storm", func(_ context.Context, fifos [2]string) (int, error) {
		started, gate := fifos[0], fifos[1]
		r, err := laneRegion()
		if err != nil {
			return 0, err
		}
		mem := r.Bytes()
		retProd := shm.U32(mem, partOffset(r, partRetRing))
		reqCons := shm.U32(mem, partOffset(r, partReqRing)+64)
		arm := r.Returns().Completion().Word()
		words := []*atomic.Uint32{arm, r.AbortWake(), r.Heartbeat(), retProd, reqCons}
		var stop atomic.Bool
		var wg sync.WaitGroup
		wg.Go(func() {
			one := [8]byte{1}
			for !stop.Load() {
				_, _ = unix.Write(lifecycle.FDDone, one[:])
			}
		})
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				arm.Store(uint32(i % 3)) // off, armed, signalled
				retProd.Store(retProd.Load())
				reqCons.Store(reqCons.Load())
				for _, w := range words {
					_, _ = futex.Wake(w, 1<<30)
				}
			}
		})
		werr := os.WriteFile(started, []byte{1}, 0o600)
		_, gerr := os.ReadFile(gate)
		stop.Store(true)
		wg.Wait()
		arm.Store(fastpath.ArmOff)
		return 42, errors.Join(werr, gerr)
	})

	moreHostileTasks = []knit.Definition{add, scribbleAll, forgeOwn, storm}
)

// ownCall finds, in the request ring, the call the lane runs now: the one whose sequence
// number the running word names.
func ownCall(r *fastpath.Region) (fn, id, gen, abort uint32, err error) {
	seq := fastpath.Started(r.Running().Load())
	req := r.Requests().Consumer()
	for i := range fastpath.Slots {
		s := req.Slot(i)
		if s.Seq() == seq { // sequence numbers are unique per lane incarnation
			return s.Fn(), s.Call(), s.Gen(), s.Abort(), nil
		}
	}
	return 0, 0, 0, 0, errors.New("own call not found in the request ring")
}

// A frozen spare: with KNIT_TEST_SPARE_FREEZE naming a file that does not exist yet, the first
// spare to start creates it and plays a spare that freezes once it is taken: it reports
// itself initialised, waits for its assignment, and stops itself (SIGSTOP) instead of booting.
// Every later spare finds the file and behaves.
func init() {
	marker := os.Getenv("KNIT_TEST_SPARE_FREEZE")
	if marker == "" || os.Getenv(lifecycle.EnvSpare) != "1" {
		return
	}
	f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	f.Close()
	if _, err := unix.Write(lifecycle.FDRegion, []byte{1}); err != nil {
		os.Exit(1)
	}
	buf, oob := make([]byte, 1<<20), make([]byte, 64)
	n, oobn, _, _, err := unix.Recvmsg(lifecycle.FDRegion, buf, oob, 0)
	if err != nil || n == 0 && oobn == 0 {
		os.Exit(0) // not needed
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	select {}
}

// Supervision: tasks that end their lane in every way there is.

// bootRecord is the part of a lane's boot record a test task needs to know where it runs.
type bootRecord struct {
	Lane        int `json:"lane"`
	Incarnation int `json:"incarnation"`
}

// thisLane is the lane a process-lane task runs on (-1 in the host).
func thisLane() bootRecord {
	b := bootRecord{Lane: -1}
	if s := os.Getenv("KNIT_BOOT"); s != "" {
		_ = json.Unmarshal([]byte(s), &b)
	}
	return b
}

// A lane booting as a restart of lane 1 (of any lane, with KNIT_TEST_BOOTFAIL_ANY) fails
// while the file KNIT_TEST_BOOTFAIL names exists.
func init() {
	if f := os.Getenv("KNIT_TEST_BOOTFAIL"); f != "" {
		if b := thisLane(); (b.Lane == 1 || os.Getenv("KNIT_TEST_BOOTFAIL_ANY") != "") && b.Incarnation > 0 {
			if _, err := os.Stat(f); err == nil {
				fmt.Fprintln(os.Stderr, "boot failure on purpose")
				os.Exit(5)
			}
		}
	}
}

// trigger ends lane 1 the way its input says, once the FIFO it names can be read: the test
// first queues held calls behind it. On other lanes it returns at once.
type trigger struct {
	Gate string
	How  string
}

var (
	endLane = knit.Define("test.sup.end", func(ctx context.Context, in trigger) (int, error) {
		if thisLane().Lane != 1 {
			return 0, nil
		}
		gate, err := os.ReadFile(in.Gate) // a FIFO: blocks until the test writes
		if err != nil || len(gate) == 0 {
			return 0, fmt.Errorf("gate: %v", err)
		}
		switch in.How {
		case "exit 0":
			os.Exit(0)
		case "exit 3":
			os.Exit(3)
		case "task panic":
			panic("task panic on purpose")
		case "runtime panic":
			go func() { panic("unrecoverable on purpose") }()
		case "SIGSEGV":
			page, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ, syscall.MAP_ANON|syscall.MAP_PRIVATE)
			if err != nil {
				return 0, err
			}
			page[0] = 1
		case "hard timeout":
		}
		<-ctx.Done() // a hard timeout kills the lane before this returns
		select {}
	})
	// hung overruns its hard timeout on lane 1.
	hung = knit.Define("test.sup.hung", func(ctx context.Context, in trigger) (int, error) {
		if thisLane().Lane != 1 {
			return 0, nil
		}
		_, _ = os.ReadFile(in.Gate)
		select {}
	}, knit.HardTimeout(2*time.Second))
	// stubborn ignores SIGTERM, tells the test so through the FIFO it names, and never
	// returns.
	stubborn = knit.Define("test.sup.stubborn", func(ctx context.Context, fifo string) (int, error) {
		signal.Ignore(syscall.SIGTERM)
		if err := os.WriteFile(fifo, []byte{1}, 0o600); err != nil {
			return 0, err
		}
		select {}
	})
	idemAdd = knit.Define("test.sup.idemadd", func(_ context.Context, in [2]int64) (int64, error) {
		return in[0] + in[1], nil
	}, knit.Idempotent())
	supTasks = []knit.Definition{add, sleepy, endLane, hung, stubborn, idemAdd}
)

// Settlement: tasks that count their runs in a file that the test and every lane map, so
// that a test can tell how often each call really ran.

// chaosCall is one call of the chaos test: ID indexes the run counters; a call whose Die is
// set SIGKILLs its own lane the first time it runs (a marker file makes it once only).
type chaosCall struct {
	ID  int
	Die bool
}

const envRuns = "KNIT_TEST_RUNS" // the counters file; the marker files go beside it

var (
	chaosOnce  = knit.Define("test.settle.once", chaosRun)
	chaosIdem  = knit.Define("test.settle.idem", chaosRun, knit.Idempotent())
	alwaysDies = knit.Define("test.settle.poison", func(context.Context, int) (int, error) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}, knit.Idempotent())
)

var runCounters struct {
	once sync.Once
	runs []atomic.Uint32
	err  error
}

// mapRuns maps the counters file named by KNIT_TEST_RUNS (in the test and in each lane).
func mapRuns(path string) ([]atomic.Uint32, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*atomic.Uint32)(unsafe.Pointer(&mem[0])), len(mem)/4), nil
}

func chaosRun(_ context.Context, c chaosCall) (int, error) {
	runCounters.once.Do(func() { runCounters.runs, runCounters.err = mapRuns(os.Getenv(envRuns)) })
	if runCounters.err != nil {
		return 0, runCounters.err
	}
	if c.ID < 0 || c.ID >= len(runCounters.runs) {
		return 0, fmt.Errorf("call id %d out of range", c.ID)
	}
	runCounters.runs[c.ID].Add(1)
	if c.Die {
		marker := filepath.Join(filepath.Dir(os.Getenv(envRuns)), fmt.Sprintf("died-%d", c.ID))
		if f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
			f.Close()
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	return c.ID * 2, nil
}

// Recycling: runs counted in memory (goroutine lanes), and a lane's memory grown.

var (
	goRuns  atomic.Pointer[[]atomic.Uint32]
	counted = knit.Define("test.recycle.count", func(_ context.Context, id int) (int, error) {
		runs := *goRuns.Load()
		if id < 0 || id >= len(runs) {
			return 0, fmt.Errorf("call id %d out of range", id)
		}
		runs[id].Add(1)
		return 2 * id, nil
	})

	ballast [][]byte
	grow    = knit.Define("test.recycle.grow", func(_ context.Context, mib int) (int, error) {
		b := make([]byte, mib<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1 // resident, not only reserved
		}
		ballast = append(ballast, b)
		return len(ballast), nil
	})
)

// Limits: tasks that use up what a lane's limits bound.

var (
	// hoardMem allocates without bound, touching every page, and keeps all of it.
	hoardMem = knit.Define("test.limits.hoard", func(ctx context.Context, _ int) (int, error) {
		return hoard(ctx)
	})
	// hoardThreads hoards like hoardMem while 64 goroutines sleep in system calls, so that
	// the runtime keeps starting threads (pthread_create, in this cgo-linked binary), whose
	// stacks RLIMIT_DATA counts too.
	hoardThreads = knit.Define("test.limits.hoardthreads", func(ctx context.Context, _ int) (int, error) {
		for range 64 {
			go func() {
				for ctx.Err() == nil {
					ts := unix.NsecToTimespec(int64(time.Millisecond))
					_ = unix.Nanosleep(&ts, nil)
				}
			}()
		}
		return hoard(ctx)
	})
	// openFiles opens /dev/null n times, and closes them all before it returns.
	openFiles = knit.Define("test.limits.files", func(_ context.Context, n int) (int, error) {
		var files []*os.File
		defer func() {
			for _, f := range files {
				f.Close()
			}
		}()
		for i := range n {
			f, err := os.Open(os.DevNull)
			if err != nil {
				return i, err
			}
			files = append(files, f)
		}
		return n, nil
	})
	// burnCPU computes until its call is cancelled.
	burnCPU = knit.Define("test.limits.burn", func(ctx context.Context, _ int) (int, error) {
		x := 0
		for ctx.Err() == nil {
			for i := range 1 << 20 {
				x ^= i
			}
		}
		return x, nil
	})
	// startSetsid starts `sleep 1000` in a session of its own (setsid): out of the lane's
	// process group, so that killing the group misses it. It returns the child's pid.
	startSetsid = knit.Define("test.limits.setsid", func(context.Context, int) (int, error) {
		cmd := exec.Command("sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	// laneLimits returns the lane's /proc/self/limits and its Go memory limit.
	laneLimits = knit.Define("test.limits.show", func(context.Context, int) ([]string, error) {
		b, err := os.ReadFile("/proc/self/limits")
		return []string{string(b), strconv.FormatInt(debug.SetMemoryLimit(-1), 10)}, err
	})
	limitTasks = []knit.Definition{add, hoardMem, hoardThreads, openFiles, burnCPU, startSetsid, exit3, laneLimits}
)

// hoard allocates without bound, touching every page, and keeps all of it.
func hoard(ctx context.Context) (int, error) {
	var kept [][]byte
	for ctx.Err() == nil {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		kept = append(kept, b)
	}
	return len(kept), ctx.Err()
}

// Metrics: a task whose lane is killed.

// hardStall overruns its HardTimeout: on a process lane the host kills the lane.
var hardStall = knit.Define("test.metrics.hardstall", func(ctx context.Context, _ int) (int, error) {
	time.Sleep(time.Hour) // ignores its context: only the kill ends it
	return 0, nil
}, knit.HardTimeout(50*time.Millisecond))

// Sandboxed lanes: a probe of what the sandbox lets a lane do.

// sandboxProbe runs one operation and reports its errno: {"read", path}, {"write", path},
// {"connect", addr}, {"exec", path}, {"signal", pid}, {"fork"}, {"clone3"}; {"threads", op...} runs op on
// 32 OS threads at once and reports its result if every thread got the same.
var sandboxProbe = knit.Define("test.sandbox.probe", func(_ context.Context, in []string) (string, error) {
	if len(in) > 0 && in[0] == "threads" {
		return threadsProbe(in[1:])
	}
	return probeOp(in)
})

func probeOp(in []string) (string, error) {
	if len(in) == 0 {
		return "", errors.New("empty probe")
	}
	arg := func() string {
		if len(in) < 2 {
			return ""
		}
		return in[1]
	}
	switch in[0] {
	case "read":
		_, err := os.ReadFile(arg())
		return errnoOf(err), nil
	case "write":
		return errnoOf(os.WriteFile(arg(), []byte("written"), 0o600)), nil
	case "connect":
		c, err := net.Dial("tcp", arg())
		if err == nil {
			c.Close()
		}
		return errnoOf(err), nil
	case "exec":
		return errnoOf(exec.Command(arg()).Run()), nil
	case "fork":
		if sysFork < 0 {
			return "", errors.New("no fork(2) here")
		}
		pid, _, e := unix.RawSyscall(uintptr(sysFork), 0, 0, 0)
		if e == 0 && pid == 0 {
			unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0) // the child, had it been made
		}
		return errnoOf(errnoErr(e)), nil
	case "signal": // signal 0: the permission check without the signal
		pid, err := strconv.Atoi(arg())
		if arg() == "self" {
			pid, err = os.Getpid(), nil
		}
		if err != nil {
			return "", err
		}
		return errnoOf(unix.Kill(pid, 0)), nil
	case "clone3":
		_, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
		return errnoOf(errnoErr(e)), nil
	}
	return "", fmt.Errorf("unknown probe %q", in[0])
}

// threadsProbe holds 32 goroutines on OS threads of their own at the same time, which makes
// the runtime start threads (a fresh lane has far fewer), and runs op on each: a layer that
// reached only some threads shows as different results.
func threadsProbe(op []string) (string, error) {
	const n = 32
	type result struct {
		tid int
		got string
		err error
	}
	results := make(chan result, n)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r := result{tid: unix.Gettid(), got: "ok"}
			if len(op) > 0 {
				r.got, r.err = probeOp(op)
			}
			results <- r
			<-release
		}()
	}
	tids, got := map[int]bool{}, map[string]int{}
	var err error
	for range n {
		r := <-results
		tids[r.tid] = true
		got[r.got]++
		err = errors.Join(err, r.err)
	}
	close(release)
	wg.Wait()
	switch {
	case err != nil:
		return "", err
	case len(tids) != n:
		return fmt.Sprintf("%d threads for %d locked goroutines", len(tids), n), nil
	case len(got) != 1:
		return fmt.Sprintf("threads disagree: %v", got), nil
	}
	for g := range got {
		return g, nil
	}
	return "", nil
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func errnoOf(err error) string {
	if err == nil {
		return "ok"
	}
	var e syscall.Errno
	if errors.As(err, &e) && errors.Is(err, e) {
		return unix.ErrnoName(e)
	}
	return "not an errno: " + err.Error()
}

var sandboxTasks = []knit.Definition{sandboxProbe, add, fault}

// Stealing: tasks that hold a lane, and the stress tests' counted calls.

var (
	// holdPID writes its lane's PID into the file named, then waits for its context.
	holdPID = knit.Define("test.steal.hold", func(ctx context.Context, file string) (int, error) {
		if err := os.WriteFile(file, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
			return 0, err
		}
		<-ctx.Done()
		return 0, ctx.Err()
	})
	// holdOnce is holdPID for an Idempotent task that holds only the first time: run again
	// (its file exists), it answers at once.
	holdOnce = knit.Define("test.steal.holdonce", func(ctx context.Context, file string) (int, error) {
		if _, err := os.Stat(file); err == nil {
			return 7, nil
		}
		if err := os.WriteFile(file, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
			return 0, err
		}
		<-ctx.Done()
		return 0, ctx.Err()
	}, knit.Idempotent())
)

var stealTasks = []knit.Definition{add, holdPID, holdOnce, sleepy}

// stressCall is one call of the stress tests. ID indexes the run counters in the file Runs
// (mapped by the test and by each lane process, so the test sees every execution, whichever
// lane ran it); a Slow call blocks its lane for stressSlow, so lanes fall behind one another
// and idle lanes have calls to take.
type stressCall struct {
	ID   int
	Runs string
	Slow bool
}

const stressSlow = 200 * time.Microsecond

var (
	stressOnce = knit.Define("test.steal.once", stressRun)
	stressIdem = knit.Define("test.steal.idem", stressRun, knit.Idempotent())
)

// stressCounters maps a counters file path to its mapping: the test stores its own before
// the pool starts (goroutine lanes run in the test process); a lane process maps the file
// on its first call.
var stressCounters sync.Map // string → []atomic.Uint32

// stressResult is what call id must return.
func stressResult(id int) int { return 3*id + 1 }

func stressRun(_ context.Context, c stressCall) (int, error) {
	v, ok := stressCounters.Load(c.Runs)
	if !ok {
		runs, _, err := mapCounters(c.Runs)
		if err != nil {
			return 0, err
		}
		v, _ = stressCounters.LoadOrStore(c.Runs, runs)
	}
	runs := v.([]atomic.Uint32)
	if c.ID < 0 || c.ID >= len(runs) {
		return 0, fmt.Errorf("call id %d out of range", c.ID)
	}
	runs[c.ID].Add(1)
	if c.Slow {
		time.Sleep(stressSlow)
	}
	return stressResult(c.ID), nil
}

// mapCounters maps the counters file at path shared.
func mapCounters(path string) ([]atomic.Uint32, []byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return unsafe.Slice((*atomic.Uint32)(unsafe.Pointer(&mem[0])), len(mem)/4), mem, nil
}

// Examples.

var (
	exampleAdd = knit.Define("example.add", func(_ context.Context, in [2]int64) (int64, error) {
		return in[0] + in[1], nil
	})
	exampleExit = knit.Define("example.exit", func(context.Context, int) (int, error) {
		os.Exit(3) // ends the lane process: the supervisor restarts it
		return 0, nil
	})
)

// Benchmarks.

var (
	benchInt = knit.Define("bench.int64", func(_ context.Context, in int64) (int64, error) {
		return in + 1, nil
	})
	benchBytes = knit.Define("bench.bytes1KiB", func(_ context.Context, in []byte) ([]byte, error) {
		return in, nil
	})
)

// supLaneTimes is what supLaneTimesTask reports from a lane.
type supLaneTimes struct {
	Lane, Incarnation int
	Init, Epoch       int64 // UnixNano: supLaneInit; the host's epoch from the boot record
}

var supLaneTimesTask = knit.Define("bench.sup.lanetimes", func(context.Context, int64) (supLaneTimes, error) {
	var boot struct {
		Lane        int   `json:"lane"`
		Incarnation int   `json:"incarnation"`
		Epoch       int64 `json:"epoch"`
	}
	if err := json.Unmarshal([]byte(os.Getenv("KNIT_BOOT")), &boot); err != nil {
		return supLaneTimes{}, fmt.Errorf("not in a lane: %v", err)
	}
	return supLaneTimes{Lane: boot.Lane, Incarnation: boot.Incarnation, Init: supLaneInit.UnixNano(), Epoch: boot.Epoch}, nil
})

// supLaneInit is when this package was initialised: in a lane process, the end of the test
// binary's package initialisation, give or take the packages initialised after it. (It is
// the last variable of the package's last file: the others are initialised before it.)
var supLaneInit = time.Now()

// Careless callers (config_test.go, call_test.go): inputs too large to send.
type blob struct {
	Name string
	Data []byte
}

var (
	blobLen = knit.Define("test.blob.len", func(_ context.Context, b blob) (int, error) { return len(b.Data), nil })
	strLen  = knit.Define("test.str.len", func(_ context.Context, s string) (int, error) { return len(s), nil })
)

// Map (map_test.go): squares; an error for a negative input; mapCrash (process lanes only)
// crashes its lane for input 13.
var (
	mapSquare = knit.Define("test.map.square", func(_ context.Context, x int) (int, error) {
		if x < 0 {
			return 0, fmt.Errorf("negative %d", x)
		}
		return x * x, nil
	})
	mapCrash = knit.Define("test.map.crash", func(_ context.Context, x int) (int, error) {
		if x == 13 {
			go panic("crash the lane") // a goroutine's panic ends the process
			select {}
		}
		return x * x, nil
	})
	mapCrashIdempotent = knit.Define("test.map.crash.idempotent", func(_ context.Context, x int) (int, error) {
		if x == 13 {
			go panic("crash the lane")
			select {}
		}
		return x * x, nil
	}, knit.Idempotent())
	// mapBig answers each element with x bytes.
	mapBig = knit.Define("test.map.big", func(_ context.Context, x int) ([]byte, error) {
		return make([]byte, x), nil
	})
	mapBigIdempotent = knit.Define("test.map.big.idempotent", func(_ context.Context, x int) ([]byte, error) {
		return make([]byte, x), nil
	}, knit.Idempotent())
)

// Many tasks (task_test.go): 100,000 of them, defined only in the helper process that asks.
// envManyTasks makes the test binary define manyTaskCount more tasks at init. KNIT_*
// variables reach every lane, so a lane of that binary defines them the same way as its
// host; every other run defines none, as they would cost every lane of every test their
// init.
const envManyTasks = "KNIT_TEST_MANY_TASKS"

const manyTaskCount = 100_000

var manyDefs, manyHeap = defineManyTasks()

// defineManyTasks defines the many tasks when envManyTasks asks for them, and reports the
// heap they keep, in bytes.
func defineManyTasks() ([]knit.Definition, uint64) {
	if os.Getenv(envManyTasks) == "" {
		return nil, 0
	}
	before := liveHeapNow()
	defs := make([]knit.Definition, manyTaskCount)
	for i := range defs {
		k := int64(i)
		defs[i] = knit.Define(fmt.Sprintf("test.many.%d", i), func(_ context.Context, n int64) (int64, error) { return n + k, nil })
	}
	return defs, liveHeapNow() - before
}

func liveHeapNow() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// maxHeapPerTask bounds the heap a task that was never called keeps (about 500 bytes: its
// definition, codecs and registry entries).
const maxHeapPerTask = 2048

// Named rendezvous behind a wrapper that closes descriptors (lane_process_test.go).
// truncOwnRegion resizes the lane's region file wherever the lane holds it.
var truncOwnRegion = knit.Define("test.fds.truncate", func(_ context.Context, size int64) (string, error) {
	return fmt.Sprint(unix.Ftruncate(lifecycle.RegionFD(), size)), nil
})

// A sandboxed lane turns on its host: every way a process of the host's user acts on another
// through a pid (issue 29). The probes set what the host has already (its own limits, nice
// value, affinity, I/O priority, OOM score), so that an attack that gets through changes
// nothing; whether the kernel let it through is what each reports.

// hostProbe is one attack: Op on process PID; Addr and Value for the memory ops, Vals for
// the others.
type hostProbe struct {
	Op    string
	PID   int
	Addr  uint64
	Value uint64
	Vals  []int64
}

// hostAttack runs a hostProbe in the lane and reports the errno it failed with, or "ok"
// (with what it read, for memread).
var hostAttack = knit.Define("test.sandbox.host", func(_ context.Context, in hostProbe) (string, error) {
	return attackHost(in)
})

const ioprioWhoProcess = 1 // linux/ioprio.h

func attackHost(in hostProbe) (string, error) {
	pid := uintptr(in.PID)
	arg := func(i int) int64 {
		if i < len(in.Vals) {
			return in.Vals[i]
		}
		return 0
	}
	switch in.Op {
	case "prlimit": // Vals: resource, soft, hard
		lim := unix.Rlimit{Cur: uint64(arg(1)), Max: uint64(arg(2))}
		_, _, e := unix.RawSyscall6(unix.SYS_PRLIMIT64, pid, uintptr(arg(0)), uintptr(unsafe.Pointer(&lim)), 0, 0, 0)
		return errnoOf(errnoErr(e)), nil
	case "setpriority": // Vals: nice
		_, _, e := unix.RawSyscall(unix.SYS_SETPRIORITY, unix.PRIO_PROCESS, pid, uintptr(arg(0)))
		return errnoOf(errnoErr(e)), nil
	case "affinity":
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(in.PID, &set); err != nil {
			return "", err
		}
		return errnoOf(unix.SchedSetaffinity(in.PID, &set)), nil
	case "ioprio":
		prio, _, e := unix.RawSyscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, pid, 0)
		if e != 0 {
			return "", e
		}
		_, _, e = unix.RawSyscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, pid, prio)
		return errnoOf(errnoErr(e)), nil
	case "setpgid": // Vals: the group to join
		err := unix.Setpgid(0, int(arg(0)))
		if err == nil {
			_ = unix.Setpgid(0, 0) // its own group again
		}
		return errnoOf(err), nil
	case "setown": // have the kernel signal PID when a pipe of the lane's is ready
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return "", err
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		_, _, e1 := unix.RawSyscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETOWN, pid)
		// SIGURG, which the Go runtime takes in its stride, rather than SIGKILL.
		_, _, e2 := unix.RawSyscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETSIG, uintptr(unix.SIGURG))
		return errnoOf(errnoErr(e1)) + " " + errnoOf(errnoErr(e2)), nil
	case "memread", "memwrite":
		mode := os.O_RDONLY
		if in.Op == "memwrite" {
			mode = os.O_RDWR
		}
		f, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", in.PID), mode, 0)
		if err != nil {
			return errnoOf(err), nil
		}
		defer f.Close()
		var b [8]byte
		if in.Op == "memwrite" {
			binary.NativeEndian.PutUint64(b[:], in.Value)
			_, err = f.WriteAt(b[:], int64(in.Addr))
			return errnoOf(err), nil
		}
		if _, err := f.ReadAt(b[:], int64(in.Addr)); err != nil {
			return errnoOf(err), nil
		}
		return "ok " + strconv.FormatUint(binary.NativeEndian.Uint64(b[:]), 10), nil
	case "oomadj": // a file of the host's that its user may write without ptrace access
		path := fmt.Sprintf("/proc/%d/oom_score_adj", in.PID)
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		return errnoOf(os.WriteFile(path, b, 0)), nil
	case "otherlane": // Vals: the pool's two lane pids; open the other one's region
		other := int(arg(0))
		if other == os.Getpid() {
			other = int(arg(1))
		}
		f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/3", other), os.O_RDWR, 0)
		if err == nil {
			f.Close()
		}
		return errnoOf(err), nil
	case "privileges": // what the lane holds: "CapPrm CapEff NoNewPrivs dumpable"
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return "", err
		}
		var out []string
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && (k == "CapPrm" || k == "CapEff" || k == "NoNewPrivs") {
				out = append(out, k+"="+strings.TrimSpace(v))
			}
		}
		d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
		if err != nil {
			return "", err
		}
		return strings.Join(append(out, "dumpable="+strconv.Itoa(d)), " "), nil
	case "execcaps": // what a program the lane runs holds
		out, err := exec.Command("grep", "-E", "^Cap(Prm|Eff)", "/proc/self/status").Output()
		return strings.Join(strings.Fields(string(out)), " "), err
	case "pidfd":
		fd, err := unix.PidfdOpen(in.PID, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errnoOf(err), nil
	}
	return "", fmt.Errorf("unknown host probe %q", in.Op)
}

// escapeScript makes, for each of its arguments (a lane cgroup's directory), a cgroup beside
// it and moves itself there; it prints "escaped" if it could everywhere, "refused"
// otherwise, and sleeps.
const escapeScript = `r=escaped

for d in "$@"; do
	if ! mkdir "$d/../escape.$$" 2>/dev/null || ! (echo $$ > "$d/../escape.$$/cgroup.procs") 2>/dev/null; then r=refused; fi
done
echo "$r"
exec sleep 1000`

// leaveCgroup, with child set, starts escapeScript in a session of its own (out of the
// lane's process group) and returns "<pid> <what it printed>"; without, the lane itself
// tries: it returns the errno of its first refused step, or "ok".
var leaveCgroup = knit.Define("test.cgroup.leave", func(_ context.Context, child bool) (string, error) {
	dirs, err := laneCgroupDirs()
	if err != nil {
		return "", err
	}
	if !child {
		for _, d := range dirs {
			esc := filepath.Join(filepath.Dir(d), "escape."+strconv.Itoa(os.Getpid()))
			if err := unix.Mkdir(esc, 0o755); err != nil {
				return errnoOf(err), nil
			}
			if err := os.WriteFile(filepath.Join(esc, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
				return errnoOf(err), nil
			}
		}
		return "ok", nil
	}
	cmd := exec.Command("sh", append([]string{"-c", escapeScript, "sh"}, dirs...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("escaping child: %w", err)
	}
	return strconv.Itoa(cmd.Process.Pid) + " " + strings.TrimSpace(line), nil
})

// Cancel storms (lane_test.go): a call that takes 5 ms whatever its context says.
var stubbornNap = knit.Define("test.nap.stubborn", func(context.Context, int) (int, error) {
	time.Sleep(5 * time.Millisecond)
	return 0, nil
})

// Hard timeouts (call_test.go): a nap of in milliseconds, deaf to its context, under a
// HardTimeout of 3 s.
var hardNap = knit.Define("test.hard.nap", func(_ context.Context, ms int) (int, error) {
	time.Sleep(time.Duration(ms) * time.Millisecond)
	return ms, nil
}, knit.HardTimeout(3*time.Second))

// Stealing under kills (steal_test.go): a spin that only a kill ends, under a HardTimeout
// of 300 ms, and a 2 ms call under a Timeout of 300 ms.
var (
	hardSpin = knit.Define("test.steal.hardspin", func(context.Context, int) (int, error) {
		for {
		}
	}, knit.HardTimeout(300*time.Millisecond))
	nap2ms = knit.Define("test.steal.nap2ms", func(_ context.Context, x int) (int, error) {
		time.Sleep(2 * time.Millisecond)
		return x, nil
	}, knit.Timeout(300*time.Millisecond))
)

// A lane that writes the pool's shared submit ring (steal_stress_test.go,
// TestStealHostileLane).

// scribbleIn says what stealScribble writes, and for how long.
type scribbleIn struct {
	Target string // a word of steal.Ring.Words (all of a family: "want" is every want/N), or "aborts"
	MS     int
	Seed   uint64
	Limit  int // stealSit: the most calls it sits on
}

// stealScribble writes, for MS milliseconds, every word of its lane's shared submit ring
// that Target names, again and again, with values no claim would write: random ones, zero,
// one more and one less than the word holds, all ones, the word with a bit flipped. It
// returns how many rounds it wrote, and its lane's PID.
var stealScribble = knit.Define("test.hostile.stealscribble", func(_ context.Context, in scribbleIn) (scribbleOut, error) {
	mem, err := stealMapping()
	if err != nil {
		return scribbleOut{}, err
	}
	ring, err := steal.Open(mem)
	if err != nil {
		return scribbleOut{}, err
	}
	type word struct{ off, size int }
	var words []word
	if in.Target == "aborts" {
		bm, err := ring.Aborts(mem, fastpath.DefaultAbortBits)
		if err != nil {
			return scribbleOut{}, err
		}
		off := (len(ring.Bytes()) + 63) &^ 63 // the bitmap follows the ring (steal.Ring.Aborts)
		for o := off; o+4 <= off+fastpath.BitmapSize(bm.Len()); o += 4 {
			words = append(words, word{o, 4})
		}
	}
	for _, w := range ring.Words() {
		if w.Name != in.Target && !strings.HasPrefix(w.Name, in.Target+"/") {
			continue
		}
		size := 8
		if w.Size%8 != 0 || w.Name == "control" || strings.HasPrefix(w.Name, "slot/") {
			size = 4
		}
		for o := w.Offset; o+size <= w.Offset+w.Size; o += size {
			words = append(words, word{o, size})
		}
	}
	if len(words) == 0 {
		return scribbleOut{}, fmt.Errorf("no word named %q", in.Target)
	}
	rng := rand.New(rand.NewPCG(in.Seed, 0x5eed))
	value := func(round int, old uint64) uint64 {
		switch round % 6 {
		case 0:
			return rng.Uint64()
		case 1:
			return 0
		case 2:
			return old + 1
		case 3:
			return old - 1
		case 4:
			return ^uint64(0)
		}
		return old ^ 1<<rng.IntN(64)
	}
	deadline := time.Now().Add(time.Duration(in.MS) * time.Millisecond)
	round := 0
	for ; time.Now().Before(deadline); round++ {
		for _, w := range words {
			p := unsafe.Pointer(&mem[w.off])
			if w.size == 8 {
				a := (*atomic.Uint64)(p)
				a.Store(value(round, a.Load()))
			} else {
				a := (*atomic.Uint32)(p)
				a.Store(uint32(value(round, uint64(a.Load()))))
			}
		}
		runtime.Gosched()
	}
	return scribbleOut{Rounds: round, PID: os.Getpid()}, nil
})

// scribbleOut is what stealScribble did: rounds of writes, from the lane with this PID.
type scribbleOut struct{ Rounds, PID int }

// stealMapping maps, once more, the shared submit ring its lane process received: the
// descriptor /proc/self/fd shows as the memfd knit-steal.
func stealMapping() ([]byte, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(target, "/memfd:knit-steal") {
			continue
		}
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.Dup(n)
		if err != nil {
			return nil, err
		}
		mp, err := shm.MapFile(os.NewFile(uintptr(fd), "knit-steal"))
		if err != nil {
			return nil, err
		}
		return mp.Bytes(), nil // mapped until the lane exits
	}
	return nil, errors.New("no shared submit ring in this process")
}

// stealSit plays a lane that claims calls from a Ticket ring by the protocol's own words
// (the head moved on one ticket, the slot retired) and never sends the host its notice: it
// sits on up to Limit calls, polling for at most MS milliseconds, and returns how many it
// took.
var stealSit = knit.Define("test.hostile.stealsit", func(_ context.Context, in scribbleIn) (int, error) {
	mem, err := stealMapping()
	if err != nil {
		return 0, err
	}
	ring, err := steal.Open(mem)
	if err != nil {
		return 0, err
	}
	at := map[string]int{}
	for _, w := range ring.Words() {
		at[w.Name] = w.Offset
	}
	head := (*atomic.Uint64)(unsafe.Pointer(&mem[at["head"]]))
	tail := (*atomic.Uint64)(unsafe.Pointer(&mem[at["tail"]]))
	w := (*atomic.Uint32)(unsafe.Pointer(&mem[at["W"]]))
	took := 0
	deadline := time.Now().Add(time.Duration(in.MS) * time.Millisecond)
	for took < in.Limit && time.Now().Before(deadline) {
		h := head.Load()
		t := h >> 11
		if tail.Load() <= t {
			runtime.Gosched()
			continue
		}
		slot := (*atomic.Uint32)(unsafe.Pointer(&mem[at["order"]+4*int(t%steal.Slots)])).Load() % steal.Slots
		if !head.CompareAndSwap(h, (t+1)<<11|1<<5|h&31) {
			continue
		}
		for { // retire the slot, as a claimant does before its notice
			old := w.Load()
			if w.CompareAndSwap(old, old^1<<slot) {
				break
			}
		}
		took++
	}
	return took, nil
})
