package lifecycle

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/knitgo/knit/internal/fds"
	"github.com/knitgo/knit/internal/shm"
	"golang.org/x/sys/unix"
)

// envBootHelper makes the test binary play a lane that receives its boot record and reports
// what it got (TestHelperBootReceiver).
const envBootHelper = "KNIT_TEST_BOOT_HELPER"

// bootDigest sums a record's tasks, so that a lane can report in one line what it received.
func bootDigest(b Boot) string {
	h := fnv.New64a()
	for _, t := range b.Tasks {
		fmt.Fprintf(h, "%s/%d/%d;", t.Name, t.Index, t.Fingerprint)
	}
	return fmt.Sprintf("lane=%d inc=%d tasks=%d sum=%x", b.Lane, b.Incarnation, len(b.Tasks), h.Sum64())
}

// TestHelperBootReceiver is not a test: run as a lane (TestBootTransport), it receives its
// boot record the way Serve does and prints, on one line, the record's digest, what its
// descriptors FDRegion, FDDone and FDSteal hold, and whether the record's descriptor is
// still open.
func TestHelperBootReceiver(t *testing.T) {
	if os.Getenv(envBootHelper) == "" {
		return
	}
	// What the process holds before it receives anything, but for the host's placeholders
	// (memfds, a spare's socket): its own files (the Go runtime's among them, at the lowest
	// numbers a wrapper left free), which the boot must not replace.
	before := map[int]fds.ID{}
	for fd := range 16 {
		var st unix.Stat_t
		_, sealErr := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
		if id, ok := fds.Of(fd); ok && unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFSOCK && sealErr != nil {
			before[fd] = id
		}
	}
	record, at, err := receiveBoot()
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	var replaced []string
	for fd, id := range before {
		if now, ok := fds.Of(fd); !ok || now != id {
			replaced = append(replaced, fmt.Sprint(fd))
		}
	}
	slices.Sort(replaced)
	b, err := DecodeBoot(record)
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	var held []string
	placed := []int{at.region, at.done}
	if b.Steal {
		placed = append(placed, at.steal)
	}
	where := "fixed"
	for i, fd := range placed {
		if fd != FDRegion+i {
			where = "moved"
		}
		data, err := shm.ReadSealed(os.NewFile(uintptr(fd), "placed"), 64)
		if err != nil {
			data = []byte(err.Error())
		}
		held = append(held, string(data))
	}
	open := false
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.Contains(target, "knit-boot") {
			open = true
		}
	}
	fmt.Printf("%s files=%s at=%s boot-open=%v replaced=%s\n", bootDigest(b), strings.Join(held, ","), where, open,
		strings.Join(replaced, ","))
	os.Exit(0)
}

// closeFDs is a wrapper that closes the descriptors a lane inherits, as SharedMemory Named
// allows: the Go runtime then opens its own files at 3 and up.
var closeFDs = []string{"sh", "-c", `exec 3>&- 4>&- 5>&- 6>&-; exec "$@"`, "sh"}

// TestBootTransport: a lane receives a boot record of 100,000 tasks (3.5 MB) and its
// descriptors, on fds 3 to 5, whichever way it starts: inheriting them, collecting them from
// a rendezvous (Named), or as a spare assigned by message on its socket (inherited or
// connected through a rendezvous); with and without a shared submit ring. The record's
// descriptor is closed once read. Behind a wrapper that closes inherited descriptors, the
// lane replaces none of the files the Go runtime opened at those numbers (its cgroup files,
// its epoll descriptor: replacing that one is fatal at the next netpoll), and serves from
// wherever its own descriptors came. (An environment variable carried the record before:
// over 128 KiB, about 1,900 tasks, exec failed with "argument list too long"; and the lane
// put its descriptors on 3 to 5 with dup2, over whatever was there.)
func TestBootTransport(t *testing.T) {
	b := Boot{Lane: 3, Incarnation: 2, Tasks: manyTasks(100_000)}
	want := bootDigest(b)
	for _, c := range []struct {
		name                  string
		named, spare, closing bool
	}{
		{"inherit", false, false, false}, {"named", true, false, false}, {"named-closing", true, false, true},
		{"spare", false, true, false}, {"spare-named", true, true, false}, {"spare-named-closing", true, true, true},
	} {
		for _, steal := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/steal=%v", c.name, steal), func(t *testing.T) {
				lc, logs := launcher(t, "")
				lc.Command = []string{os.Args[0], "-test.run=^TestHelperBootReceiver$"}
				lc.Env = []string{envBootHelper + "=1"}
				lc.Named = c.named
				if c.closing {
					lc.Prefix = closeFDs
				}
				files, names := []*os.File{}, []string{"region", "done"}
				if steal {
					names = append(names, "steal")
				}
				for _, n := range names {
					f, err := shm.SealedFile("knit-test-"+n, []byte(n))
					if err != nil {
						t.Fatal(err)
					}
					defer f.Close()
					files = append(files, f)
				}
				b := b
				b.Steal = steal
				var p *Process
				var err error
				if c.spare {
					s := &Spares{Launcher: lc, Count: 1, Log: lc.Log}
					defer s.Close()
					s.Refill()
					s.Wait()
					sp := s.Take()
					if sp == nil {
						t.Fatalf("no spare: %v", logs.All())
					}
					p, err = lc.Assign(sp, b, files)
				} else {
					p, err = lc.Start(b, files)
				}
				if err != nil {
					t.Fatal(err)
				}
				x := p.Wait()
				p.Collect(&x)
				<-p.output.relayed
				var lines []string
				for _, e := range logs.FilterMessage("lane stdout").All() {
					lines = append(lines, fmt.Sprint(e.ContextMap()["line"]))
				}
				if x.Status != 0 || len(lines) != 1 {
					t.Fatalf("lane exited %+v and printed %q", x, lines)
				}
				head := fmt.Sprintf("%s files=%s at=fixed ", want, strings.Join(names, ","))
				if c.closing { // the runtime's files may hold 3 to 5
					head = strings.Replace(head, "at=fixed", "at="+between(lines[0], "at=", " "), 1)
				}
				if line := head + "boot-open=false replaced="; lines[0] != line {
					t.Fatalf("lane printed %q, want %q", lines[0], line)
				}
			})
		}
	}
}

// between is what s holds after from, up to to.
func between(s, from, to string) string {
	_, s, _ = strings.Cut(s, from)
	s, _, _ = strings.Cut(s, to)
	return s
}

// A lane without a boot record, or with EnvBoot holding no settings, says so and does not
// boot.
func TestReceiveBootWithout(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"", "no KNIT_BOOT: this process was not started by a knit host"},
		{"fd", "KNIT_BOOT: invalid character"},
	} {
		t.Setenv(EnvBoot, c.env)
		if _, _, err := receiveBoot(); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s=%q: %v, want %q", EnvBoot, c.env, err, c.want)
		}
	}
}

// TestBootEnv: EnvBoot carries the settings, never the tasks; settings too large for it are
// cut to what says which lane it is and where its record is.
func TestBootEnv(t *testing.T) {
	b := testBoot(manyTasks(10_000))
	env, err := bootEnv(b, maxBootEnv)
	if err != nil {
		t.Fatal(err)
	}
	var got Boot
	if err := json.Unmarshal([]byte(env), &got); err != nil || len(env) > maxBootEnv {
		t.Fatalf("%d bytes: %v", len(env), err)
	}
	want := b
	want.Tasks = nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("settings %+v, want %+v", got, want)
	}
	b.Sandbox = &Sandbox{Landlock: Landlock{ReadOnly: []string{strings.Repeat("/x", maxBootEnv)}}}
	if env, err = bootEnv(b, maxBootEnv); err != nil || len(env) > maxBootEnv {
		t.Fatalf("oversized settings: %d bytes, %v", len(env), err)
	}
	got = Boot{}
	if err := json.Unmarshal([]byte(env), &got); err != nil ||
		!reflect.DeepEqual(got, Boot{Version: b.Version, Lane: b.Lane, Incarnation: b.Incarnation, Shm: b.Shm}) {
		t.Fatalf("oversized settings cut to %s, want version, lane, incarnation and shm", env)
	}
}
