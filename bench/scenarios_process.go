//go:build linux

package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"
)

// childExitTimeout bounds how long cleanup waits for a child to exit after
// the parent closed its end; past it the child is killed (and reaped).
const childExitTimeout = 5 * time.Second

// processScenarios: rows 6–9 of the README — a child process (this binary
// re-executed) answering over a unix socket, over shared memory with
// spinning, over shared memory with futexes, and through hashicorp/go-plugin.
func processScenarios() []scenario {
	rows := []scenario{
		{name: "unix socket child: round trip", inFlight: 1, setup: setupUnixRoundTrip,
			meta: rowMeta{Impl: implUnixSocket, Shape: shapeRoundTrip, Lanes: 1}},
		{name: fmt.Sprintf("unix socket child: pipelined, %d in flight", inFlightTarget), inFlight: inFlightTarget, setup: setupUnixPipelined,
			meta: rowMeta{Impl: implUnixSocket, Shape: shapePipelined, Lanes: 1, Window: inFlightTarget}},
	}
	for _, w := range windowSweep {
		rows = append(rows, scenario{
			name:     fmt.Sprintf("unix socket child: window %d", w),
			inFlight: w,
			meta:     rowMeta{Impl: implUnixSocket, Shape: shapeWindow, Lanes: 1, Window: w},
			setup:    func() (func(*testing.B), func() error, error) { return setupUnixWindow(w) },
		})
	}
	return append(rows, []scenario{
		{name: "shm spin child: round trip", inFlight: 1, setup: func() (func(*testing.B), func() error, error) { return setupShm(false) },
			meta: rowMeta{Impl: implShmSpin, Shape: shapeRoundTrip, Lanes: 1}},
		{name: "shm futex child: round trip", inFlight: 1, setup: func() (func(*testing.B), func() error, error) { return setupShm(true) }},
		{name: "go-plugin net/rpc: round trip", inFlight: 1, setup: setupPluginRoundTrip},
		{name: fmt.Sprintf("go-plugin net/rpc: %d in flight", inFlightTarget), inFlight: inFlightTarget, slow: true, setup: setupPluginThroughput},
	}...)
}

// --- unix socket ---------------------------------------------------------

// startUnixChild makes a socketpair, hands one end to a KNIT_BENCH_CHILD=unix
// child as fd 3 and returns the other end as a net.Conn, plus a cleanup
// that closes the conn (the child then reads EOF and exits) and reaps it.
func startUnixChild() (net.Conn, func() error, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	parentFile := os.NewFile(uintptr(fds[0]), "bench-socket-parent")
	childFile := os.NewFile(uintptr(fds[1]), "bench-socket-child")
	conn, err := net.FileConn(parentFile) // dups the fd
	parentFile.Close()
	if err != nil {
		childFile.Close()
		return nil, nil, fmt.Errorf("FileConn: %w", err)
	}
	c, err := startChild(childUnix, childFile)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	cleanup := func() error {
		cerr := conn.Close()
		return errors.Join(cerr, c.wait(childExitTimeout))
	}
	return conn, cleanup, nil
}

// setupUnixRoundTrip: write one 8-byte message, read the echo; one in
// flight, no buffering.
func setupUnixRoundTrip() (func(*testing.B), func() error, error) {
	conn, cleanup, err := startUnixChild()
	if err != nil {
		return nil, nil, err
	}
	var out, in [unixMsgSize]byte
	var seq uint64
	body := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			seq++
			binary.LittleEndian.PutUint64(out[:], seq)
			if _, err := conn.Write(out[:]); err != nil {
				fail(b, fmt.Errorf("unix write: %w", err))
				return
			}
			if _, err := io.ReadFull(conn, in[:]); err != nil {
				fail(b, fmt.Errorf("unix read: %w", err))
				return
			}
			if got := binary.LittleEndian.Uint64(in[:]); got != seq {
				fail(b, fmt.Errorf("unix echo: got %d, want %d", got, seq))
				return
			}
		}
	}
	return body, cleanup, nil
}

// setupUnixPipelined: one writer goroutine keeps up to inFlightTarget
// messages outstanding through a buffered writer (flushing whenever it would
// have to wait for a slot); one reader goroutine drains the echoes through a
// buffered reader and checks their order.
func setupUnixPipelined() (func(*testing.B), func() error, error) {
	conn, cleanup, err := startUnixChild()
	if err != nil {
		return nil, nil, err
	}
	bw := bufio.NewWriterSize(conn, 64<<10)
	br := bufio.NewReaderSize(conn, 64<<10)
	var seq uint64
	body := func(b *testing.B) {
		n := b.N
		first := seq + 1
		slots := make(chan struct{}, inFlightTarget)
		readErr := make(chan error, 1)
		go func() {
			var in [unixMsgSize]byte
			for i := 0; i < n; i++ {
				if _, err := io.ReadFull(br, in[:]); err != nil {
					readErr <- fmt.Errorf("unix read: %w", err)
					return
				}
				if got, want := binary.LittleEndian.Uint64(in[:]), first+uint64(i); got != want {
					readErr <- fmt.Errorf("unix echo: got %d, want %d", got, want)
					return
				}
				<-slots
			}
			readErr <- nil
		}()
		var out [unixMsgSize]byte
		var werr error
		for i := 0; i < n && werr == nil; i++ {
			select {
			case slots <- struct{}{}:
			default:
				// Window full: push what is buffered, then wait for a slot.
				if werr = bw.Flush(); werr != nil {
					break
				}
				slots <- struct{}{}
			}
			seq++
			binary.LittleEndian.PutUint64(out[:], seq)
			_, werr = bw.Write(out[:])
		}
		if werr == nil {
			werr = bw.Flush()
		}
		if werr != nil {
			// The reader may be stuck waiting for replies that will not
			// come; closing the conn (cleanup does it again, harmlessly)
			// unblocks it.
			conn.Close()
			<-readErr
			fail(b, fmt.Errorf("unix write: %w", werr))
			return
		}
		if err := <-readErr; err != nil {
			fail(b, err)
		}
	}
	return body, cleanup, nil
}

// setupUnixWindow: the sliding-window shape over the socket, from one
// goroutine, like the knit and channel-pool window rows: write w messages,
// then repeatedly read the oldest echo and write one more. Writes go
// through a buffered writer that is flushed only when the goroutine is about
// to block on a read (no whole echo buffered), so a window of 1 is a plain
// round trip and a large window batches like the pipelined row — but with
// one goroutine instead of a writer and a reader.
func setupUnixWindow(w int) (func(*testing.B), func() error, error) {
	conn, cleanup, err := startUnixChild()
	if err != nil {
		return nil, nil, err
	}
	bw := bufio.NewWriterSize(conn, 64<<10) // > inFlightTarget*unixMsgSize: Write never flushes by itself
	br := bufio.NewReaderSize(conn, 64<<10)
	var seq uint64
	body := func(b *testing.B) {
		n := b.N
		first := seq + 1
		var out, in [unixMsgSize]byte
		send := func() error {
			seq++
			binary.LittleEndian.PutUint64(out[:], seq)
			_, err := bw.Write(out[:])
			return err
		}
		for i := 0; i < min(w, n); i++ {
			if err := send(); err != nil {
				fail(b, fmt.Errorf("unix write: %w", err))
				return
			}
		}
		for i := 0; i < n; i++ {
			if br.Buffered() < unixMsgSize {
				if err := bw.Flush(); err != nil {
					fail(b, fmt.Errorf("unix write: %w", err))
					return
				}
			}
			if _, err := io.ReadFull(br, in[:]); err != nil {
				fail(b, fmt.Errorf("unix read: %w", err))
				return
			}
			if got, want := binary.LittleEndian.Uint64(in[:]), first+uint64(i); got != want {
				fail(b, fmt.Errorf("unix echo: got %d, want %d", got, want))
				return
			}
			if i+w < n {
				if err := send(); err != nil {
					fail(b, fmt.Errorf("unix write: %w", err))
					return
				}
			}
		}
	}
	return body, cleanup, nil
}

// --- shared memory ---------------------------------------------------------

// shmPeer is a child sharing one page with the parent.
type shmPeer struct {
	mem   []byte
	req   *uint32
	reply *uint32
	child *child
	life  *os.File
}

func startShmChild(role string) (*shmPeer, error) {
	fd, err := unix.MemfdCreate("knit-bench-shm", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	memfd := os.NewFile(uintptr(fd), "bench-memfd")
	if err := unix.Ftruncate(fd, shmSize); err != nil {
		memfd.Close()
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, shmSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		memfd.Close()
		return nil, fmt.Errorf("mmap: %w", err)
	}
	lifeR, lifeW, err := lifeline()
	if err != nil {
		memfd.Close()
		unix.Munmap(mem)
		return nil, err
	}
	c, err := startChild(role, memfd, lifeR) // closes memfd and lifeR here
	if err != nil {
		lifeW.Close()
		unix.Munmap(mem)
		return nil, err
	}
	return &shmPeer{
		mem:   mem,
		req:   shmWord(mem, shmReqWord),
		reply: shmWord(mem, shmReplyWord),
		child: c,
		life:  lifeW,
	}, nil
}

// close closes the lifeline (the child exits), reaps the child and unmaps.
func (p *shmPeer) close() error {
	err := p.life.Close()
	err = errors.Join(err, p.child.wait(childExitTimeout))
	return errors.Join(err, unix.Munmap(p.mem))
}

var errChildDied = errors.New("child process exited")

// setupShm: the parent stores a sequence number into the request word and
// waits until the child has copied it into the reply word. With useFutex
// false both sides spin (yielding every so often, see spinPause); with useFutex true both sides sleep in FUTEX_WAIT and wake the
// other with FUTEX_WAKE, i.e. one kernel sleep/wake per message each way.
func setupShm(useFutex bool) (func(*testing.B), func() error, error) {
	role := childShmSpin
	if useFutex {
		role = childShmFutex
	}
	p, err := startShmChild(role)
	if err != nil {
		return nil, nil, err
	}
	var seq uint32
	// A bounded futex wait lets the parent notice a dead child.
	waitTimeout := unix.NsecToTimespec(int64(100 * time.Millisecond))
	body := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			seq++
			atomic.StoreUint32(p.req, seq)
			if useFutex {
				futexWake(p.req)
				for {
					v := atomic.LoadUint32(p.reply)
					if v == seq {
						break
					}
					if p.child.exited.Load() {
						fail(b, errChildDied)
						return
					}
					futexWait(p.reply, v, &waitTimeout)
				}
				continue
			}
			for polls := 1; atomic.LoadUint32(p.reply) != seq; polls++ {
				spinPause(polls)
				if polls%spinOSYieldEvery == 0 && p.child.exited.Load() {
					fail(b, errChildDied)
					return
				}
			}
		}
	}
	return body, p.close, nil
}

// --- hashicorp/go-plugin -----------------------------------------------------

// startPlugin launches this binary as a go-plugin (net/rpc protocol) and
// dispenses the incrementer. Cleanup is client.Kill, which asks the plugin
// to exit, waits for it (reaping it) and force-kills it if needed.
func startPlugin() (incrementer, func() error, error) {
	cmd, err := childCmd(childPlugin)
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = nil // go-plugin captures the plugin's stderr itself
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  pluginHandshake,
		Plugins:          pluginSet,
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolNetRPC},
		Logger:           hclog.NewNullLogger(),
	})
	cleanup := func() error {
		client.Kill()
		if !client.Exited() {
			return errors.New("go-plugin child still running after Kill")
		}
		return nil
	}
	rpcClient, err := client.Client()
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("go-plugin client: %w", err)
	}
	raw, err := rpcClient.Dispense(pluginName)
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("go-plugin dispense: %w", err)
	}
	inc, ok := raw.(incrementer)
	if !ok {
		cleanup()
		return nil, nil, fmt.Errorf("go-plugin dispensed %T, not an incrementer", raw)
	}
	return inc, cleanup, nil
}

func pluginCall(inc incrementer, v int64) error {
	got, err := inc.Inc(v)
	if err != nil {
		return fmt.Errorf("go-plugin Inc: %w", err)
	}
	if got != v+1 {
		return fmt.Errorf("go-plugin Inc(%d) = %d", v, got)
	}
	return nil
}

func setupPluginRoundTrip() (func(*testing.B), func() error, error) {
	inc, cleanup, err := startPlugin()
	if err != nil {
		return nil, nil, err
	}
	var v int64
	body := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			v++
			if err := pluginCall(inc, v); err != nil {
				fail(b, err)
				return
			}
		}
	}
	return body, cleanup, nil
}

func setupPluginThroughput() (func(*testing.B), func() error, error) {
	inc, cleanup, err := startPlugin()
	if err != nil {
		return nil, nil, err
	}
	var mu sync.Mutex // hands out distinct starting values per goroutine
	var next int64
	body := func(b *testing.B) {
		runInFlight(b, func(pb *testing.PB) {
			mu.Lock()
			next += 1 << 32
			v := next
			mu.Unlock()
			for pb.Next() {
				v++
				if err := pluginCall(inc, v); err != nil {
					fail(b, err)
					return
				}
			}
		})
	}
	return body, cleanup, nil
}
