//go:build linux

package steal

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/knitgo/knit/internal/shm"
)

// The test binary doubles as a consumer process: with KNIT_STEAL_CHILD=<id> it maps the
// inherited submit ring (fd 3), prints "ready", claims calls, prints "<call>" for each
// result, and exits when its stdin closes.
func TestMain(m *testing.M) {
	if id := os.Getenv("KNIT_STEAL_CHILD"); id != "" {
		os.Exit(childConsumer(id))
	}
	goleak.VerifyTestMain(m)
}

func childConsumer(ids string) int {
	id, _ := strconv.Atoi(ids)
	mp, err := shm.MapFile(os.NewFile(3, "submit"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 10
	}
	r, err := Open(mp.Bytes())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 11
	}
	c, err := r.Consumer(id, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 12
	}
	fmt.Println("ready") // the parent submits once every consumer claims
	var stop sync.WaitGroup
	stop.Add(1)
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
		stop.Done()
	}()
	out := bufio.NewWriter(os.Stdout)
	for {
		select {
		case <-done:
			return 0
		default:
		}
		n, err := c.Claim()
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 13
		}
		if n == 0 {
			runtime.Gosched()
			continue
		}
		calls := make([]uint32, n)
		for k := range n {
			calls[k] = c.Slot(k).Call()
		}
		c.Release()
		for k := range n {
			c.Start(k)
			fmt.Fprintln(out, calls[k], c.Call(k).Seq, c.Call(k).Slot)
			_ = out.Flush() // the result is out before the journal says finished
			c.Finish(k)
		}
	}
}

// TestProcessConsumers: two consumer processes and one goroutine consumer share a memfd
// submit ring; one process is SIGKILLed in the middle. After its output is drained (its
// "return ring") the host recovers it: fresh calls are published again, started ones fail
// unless their result arrived. Every call settles exactly once.
func TestProcessConsumers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, d := range disciplines {
		t.Run(d.String(), func(t *testing.T) { processConsumers(t, d) })
	}
}

func processConsumers(t *testing.T, d Discipline) {
	const calls, maxRounds = 20000, 50
	cfg := Config{Consumers: 3, Discipline: d, Arena: 64 << 10}
	size, err := Size(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mp, err := shm.CreateMemfd("knit-steal-test", size)
	if err != nil {
		t.Skipf("no memfd: %v", err)
	}
	defer mp.Close()
	r, err := New(mp.Bytes(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := r.Producer(nil)

	type result struct {
		call int
		who  int // -1: the child's output ended; -2: it is ready
		from int
	}
	results := make(chan result, 256)
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   sync.WaitGroup
	}
	start := func(id int) *child {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "KNIT_STEAL_CHILD="+strconv.Itoa(id))
		cmd.ExtraFiles = []*os.File{mp.File()}
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ch := &child{cmd: cmd, stdin: stdin}
		ch.out.Add(1)
		go func() {
			defer ch.out.Done()
			// A record is a whole line: a process killed in the middle of writing one leaves
			// a fragment without its newline, which is not a result (a torn record).
			rd := bufio.NewReader(stdout)
			for {
				line, err := rd.ReadString('\n')
				if err != nil {
					break
				}
				if line == "ready\n" {
					results <- result{who: -2, from: id}
					continue
				}
				f := strings.Fields(line)
				n, cerr := strconv.Atoi(f[0])
				if len(f) != 3 || cerr != nil {
					t.Errorf("consumer %d wrote %q", id, line)
					continue
				}
				results <- result{call: n, from: id}
			}
			results <- result{who: -1, from: id}
		}()
		return ch
	}
	children := map[int]*child{1: start(1), 2: start(2)}
	// Every consumer claims before the first call: a consumer process still starting
	// on a loaded machine would see the others take every call, and never be killed
	// mid-run, which is what this test is for.
	for ready := 0; ready < len(children); ready++ {
		if res := <-results; res.who != -2 {
			t.Fatalf("consumer %d: output ended before it was ready", res.from)
		}
	}

	// Consumer 0 is a goroutine.
	var stop sync.WaitGroup
	quit := make(chan struct{})
	stop.Add(1)
	go func() {
		defer stop.Done()
		c, _ := r.Consumer(0, nil)
		for {
			select {
			case <-quit:
				return
			default:
			}
			n, err := c.Claim()
			if err != nil || n == 0 {
				runtime.Gosched()
				continue
			}
			ids := make([]int, n)
			for k := range n {
				ids[k] = int(c.Slot(k).Call())
			}
			c.Release()
			for k := range n {
				c.Start(k)
				results <- result{call: ids[k], from: 0}
				c.Finish(k)
			}
		}
	}()

	settled := make([]int, calls)
	callOf := map[uint64]int{}
	queue := make([]int, 0, calls)
	for i := range calls {
		queue = append(queue, i)
	}
	done, killed := 0, false
	by := map[int]int{}
	idle := 0
	who := map[int][]int{}
	settle := func(call, from int) {
		settled[call]++
		who[call] = append(who[call], from)
		if settled[call] > 1 {
			t.Fatalf("call %d settled twice, by %v (killed %v, seqs %v)", call, who[call], killed, seqsOf(callOf, call))
		}
		done++
	}
	// A consumer process that the scheduler leaves out (a loaded machine) may take no call
	// of a round: the calls go on, round after round, until it has taken enough to be
	// killed mid-run.
	total := calls
	for round := 1; done < total || !killed && round < maxRounds; {
		if done == total {
			round++
			settled = append(settled, make([]int, calls)...)
			for i := range calls {
				queue = append(queue, total+i)
			}
			total += calls
		}
		for len(queue) > 0 {
			slot, ok := p.Reserve()
			if !ok {
				break
			}
			call := queue[0]
			queue = queue[1:]
			p.Slot(slot).SetCall(uint32(call), 0)
			if _, err := p.Put(slot, 0); err != nil {
				t.Fatal(err)
			}
			callOf[p.Stage(slot)] = call
		}
		p.Flush()
		if !killed && by[2] >= 20 {
			killed = true
			ch := children[2]
			_ = ch.cmd.Process.Signal(syscall.SIGKILL)
			// Drain its output first (its results settle their calls), then reap it (Wait
			// closes the pipe: reading must be over) and recover it.
			for drained := false; !drained; {
				res := <-results
				switch {
				case res.who == -1 && res.from == 2:
					drained = true
				case res.who == -1:
					t.Fatalf("consumer %d's output ended", res.from)
				default:
					settle(res.call, res.from)
				}
			}
			ch.out.Wait()
			_ = ch.cmd.Wait()
			rec, err := p.Recover(2)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range rec.Fresh {
				queue = append(queue, callOf[c.Seq])
			}
			for _, c := range rec.Started {
				if call := callOf[c.Seq]; settled[call] == 0 {
					settle(call, -2) // fails: it was running when its process died
				}
			}
			t.Logf("%v: killed consumer 2 after %d calls: %d fresh, %d started", d, done, len(rec.Fresh), len(rec.Started))
			delete(children, 2)
			continue
		}
		select {
		case res := <-results:
			if res.who == -1 {
				t.Fatalf("consumer %d's output ended", res.from)
			}
			by[res.from]++
			settle(res.call, res.from)
		default:
			idle++
			if idle > 20_000_000 {
				var un []string
				for c, n := range settled {
					if n == 0 {
						un = append(un, fmt.Sprintf("%d%v", c, seqsOf(callOf, c)))
					}
				}
				m := newMem(r.b, r.submit, &r.g)
				t.Fatalf("stuck: done %d, unsettled %v; H %#x W %#x live %#x want %v %v %v j %#x %#x %#x seqOf %v",
					done, un, m.load(idH), m.load(idW), m.load(idLive), m.load(r.g.want(0)), m.load(r.g.want(1)), m.load(r.g.want(2)),
					m.load(r.g.journal(0)), m.load(r.g.journal(1)), m.load(r.g.journal(2)), p.h.seqOf)
			}
			runtime.Gosched()
			continue
		}
		idle = 0
	}
	close(quit)
	stop.Wait()
	for _, ch := range children {
		_ = ch.stdin.Close()
		ch.out.Wait()
		if err := ch.cmd.Wait(); err != nil {
			t.Errorf("consumer process: %v", err)
		}
	}
	for call, s := range settled {
		if s != 1 {
			t.Fatalf("call %d settled %d times", call, s)
		}
	}
	if !killed || by[1] == 0 {
		t.Fatalf("results by consumer: %v; killed %v", by, killed)
	}
	t.Logf("%v: results by consumer %v", d, by)
}

func seqsOf(callOf map[uint64]int, call int) []uint64 {
	var s []uint64
	for q, c := range callOf {
		if c == call {
			s = append(s, q)
		}
	}
	return s
}
