package fastpath

import (
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/knitgo/knit/internal/shm"
)

// Benchmarks of the ring alone: round trip with one message in flight (consumer spinning or
// parked) and throughput with 32 in flight, for goroutine and process lanes, beside
// baselines measured in the same run: a channel ping-pong, a two-process unix-socket
// ping-pong and a raw two-process atomic ping-pong.

const spinning = 100 * time.Microsecond

func benchRoundTrip(b *testing.B, l *laneUnderTest, spin time.Duration) {
	msg := make([]byte, 8)
	nop := func(Slot, []byte) error { return nil }
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		l.send(uint32(n), msg)
		for k := 0; k == 0; {
			k, _ = l.receive(spin, nop)
		}
	}
	b.StopTimer()
	l.close(b)
}

func benchThroughput(b *testing.B, l *laneUnderTest) {
	msg := make([]byte, 8)
	nop := func(Slot, []byte) error { return nil }
	b.ReportAllocs()
	b.ResetTimer()
	sent, got := 0, 0
	for ; sent < min(b.N, Slots); sent++ {
		l.send(uint32(sent), msg)
	}
	for got < b.N {
		k, _ := l.receive(spinning, nop)
		got += k
		for ; sent < b.N && sent-got < Slots; sent++ {
			l.send(uint32(sent), msg)
		}
	}
	b.StopTimer()
	l.close(b)
}

func BenchmarkRoundTrip(b *testing.B) {
	layout := Layout{Arena: 64 << 10}
	b.Run("goroutine/spinning", func(b *testing.B) { benchRoundTrip(b, goroutineLane(b, layout, spinning), spinning) })
	b.Run("goroutine/parked", func(b *testing.B) { benchRoundTrip(b, goroutineLane(b, layout, 0), 0) })
	b.Run("process/spinning", func(b *testing.B) { benchRoundTrip(b, processLane(b, layout, spinning), spinning) })
	b.Run("process/parked", func(b *testing.B) { benchRoundTrip(b, processLane(b, layout, 0), 0) })
}

func BenchmarkThroughput32(b *testing.B) {
	layout := Layout{Arena: 64 << 10}
	b.Run("goroutine", func(b *testing.B) { benchThroughput(b, goroutineLane(b, layout, spinning)) })
	b.Run("process", func(b *testing.B) { benchThroughput(b, processLane(b, layout, spinning)) })
}

func BenchmarkBaseline(b *testing.B) {
	b.Run("channel-pingpong", func(b *testing.B) {
		req, resp := make(chan uint64), make(chan uint64)
		go func() {
			for v := range req {
				resp <- v
			}
			close(resp)
		}()
		b.ReportAllocs()
		for n := range b.N {
			req <- uint64(n)
			<-resp
		}
		close(req)
		<-resp
	})
	b.Run("unix-socket-pingpong", benchUnixSocket)
	b.Run("process-atomic-pingpong", benchAtomicPingPong)
}

func startChild(b *testing.B, mode string, f *os.File) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KNIT_FASTPATH_CHILD="+mode)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd
}

func benchUnixSocket(b *testing.B) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	parent, child := os.NewFile(uintptr(fds[0]), "parent"), os.NewFile(uintptr(fds[1]), "child")
	cmd := startChild(b, "unix", child)
	child.Close()
	var buf [8]byte
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		binary.LittleEndian.PutUint64(buf[:], uint64(n))
		if _, err := parent.Write(buf[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(parent, buf[:]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	parent.Close()
	_ = cmd.Wait()
}

func benchAtomicPingPong(b *testing.B) {
	mp, err := shm.CreateMemfd("knit-pingpong", 4096)
	if err != nil {
		b.Fatal(err)
	}
	defer mp.Close()
	cmd := startChild(b, "atomic", mp.File())
	ping, pong := shm.U32(mp.Bytes(), 0), shm.U32(mp.Bytes(), 128)
	b.ResetTimer()
	for n := uint32(1); n <= uint32(b.N); n++ {
		ping.Store(n)
		spinUntil(pong, n)
	}
	b.StopTimer()
	ping.Store(0)
	_ = cmd.Wait()
}

func spinUntil(w *atomic.Uint32, v uint32) {
	for i := 1; w.Load() != v; i++ {
		if i%64 == 0 {
			runtime.Gosched()
		}
	}
}

// baselineChild serves the two raw baselines in a child process.
func baselineChild(mode string) int {
	f := os.NewFile(3, "peer")
	switch mode {
	case "unix":
		var buf [8]byte
		for {
			if _, err := io.ReadFull(f, buf[:]); err != nil {
				return 0
			}
			if _, err := f.Write(buf[:]); err != nil {
				return 0
			}
		}
	case "atomic":
		mp, err := shm.MapFile(f)
		if err != nil {
			return 20
		}
		defer mp.Close()
		ping, pong := shm.U32(mp.Bytes(), 0), shm.U32(mp.Bytes(), 128)
		for n := uint32(1); ; n++ {
			for i := 1; ; i++ {
				v := ping.Load()
				if v == n {
					break
				}
				if v == 0 && n > 1 {
					return 0
				}
				if i%64 == 0 {
					runtime.Gosched()
				}
			}
			pong.Store(n)
		}
	}
	return 21
}
