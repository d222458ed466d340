package lifecycle

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/knitgo/knit/internal/cgroup"
	"github.com/knitgo/knit/internal/pgroup"
	"github.com/knitgo/knit/internal/procfs"
	"github.com/knitgo/knit/internal/shm"
)

// A Launcher starts a pool's lane processes and spares: the lane binary behind its prefix,
// in a scrubbed environment, in a process group (and, with Cgroups, a cgroup) of its own,
// with its output relayed to the host's logger. It holds no pool: what it needs from one is
// in its fields, set before the first start and not changed after.
type Launcher struct {
	Command []string // the lane binary and its arguments (empty: this executable)
	Prefix  []string // a wrapper the command runs under (ProcessConfig.Prefix)
	Env     []string // what the scrubbed environment lets through (ProcessConfig.Env; laneEnv)
	// Named: descriptors go through a rendezvous (shm.Rendezvous) rather than being
	// inherited, for a wrapper that closes inherited descriptors (SharedMemory Named).
	Named bool
	// StartupTimeout bounds a rendezvous's wait for its lane, and a spare's for its report.
	StartupTimeout time.Duration
	Cgroups        *Cgroups    // a cgroup per process (nil: none)
	Root           *zap.Logger // the host's root logger: lane output (NewOutput)
	Log            *zap.Logger // the lane namespace: starts, hand-overs, cgroup trouble
	// Killed, when set, is told once per process why the host kills it (Process.Kill),
	// before the signal is sent: the pool's metrics.
	Killed func(lane int, why Exit)
}

// command is a lane process's command: the configured binary behind its prefix, a scrubbed
// environment plus extra, files from fd 3 on, its own process group, and death with the
// host.
func (lc *Launcher) command(files []*os.File, extra string) (*exec.Cmd, error) {
	argv := lc.Command
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("cannot find this executable: %w", err)
		}
		argv = []string{exe}
	}
	argv = append(append([]string(nil), lc.Prefix...), argv...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(laneEnv(lc.Env), extra)
	cmd.ExtraFiles = files
	cmd.SysProcAttr = pgroup.Attr()
	cmd.WaitDelay = time.Second // a grandchild holding the output pipes open cannot hang Wait
	return cmd, nil
}

// laneEnv is a lane's scrubbed environment: KNIT_* variables, the host's PATH (so that a
// task can run programs by name) and what allow names; an entry of allow naming PATH
// replaces the host's.
func laneEnv(allow []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KNIT_") && !strings.HasPrefix(kv, EnvBoot+"=") && !strings.HasPrefix(kv, EnvLane+"=") && !strings.HasPrefix(kv, EnvSpare+"=") {
			env = append(env, kv)
		}
	}
	path := true
	for _, a := range allow {
		if name, _, _ := strings.Cut(a, "="); name == "PATH" {
			path = false
		}
	}
	if v, ok := os.LookupEnv("PATH"); ok && path {
		env = append(env, "PATH="+v)
	}
	// The race runtime's options say how the binary runs, like PATH where it finds others
	// (a race-built lane otherwise sleeps 1 s when it exits).
	if v, ok := os.LookupEnv("GORACE"); ok {
		env = append(env, "GORACE="+v)
	}
	for _, a := range allow {
		if strings.Contains(a, "=") {
			env = append(env, a)
		} else if v, ok := os.LookupEnv(a); ok {
			env = append(env, a+"="+v)
		}
	}
	return append(env, EnvLane+"=1")
}

// child is a started lane process.
type child struct {
	cmd    *exec.Cmd
	pid    int
	output *Output
	waited chan struct{} // closed once the process has been waited for
	err    error         // what Wait returned
	cg     *cgroup.Group // its cgroup, if the pool makes them
}

func startChild(cmd *exec.Cmd, out *Output) (*child, error) {
	cmd.Stdout, cmd.Stderr = out.Writer(false), out.Writer(true)
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	c := &child{cmd: cmd, pid: cmd.Process.Pid, output: out, waited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		out.Close() // Wait has waited for the pipe readers: no line comes after this
		close(c.waited)
	}()
	return c, nil
}

// spawn starts a lane process (or a spare) in a cgroup of its own when the pool has
// cgroups: on v2 it is born there (clone3 CLONE_INTO_CGROUP); on v1, which cannot do that,
// the host moves it in as soon as Start returns, before it can have received a boot
// record (a spare) or been seen ready (a lane started directly): no task of it runs
// outside. What the process's own init code starts before then stays outside.
func (lc *Launcher) spawn(cmd *exec.Cmd, out *Output) (*child, error) {
	if lc.Cgroups == nil {
		return startChild(cmd, out)
	}
	g, err := lc.Cgroups.tree.New()
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	dir, err := g.Dir()
	if err != nil {
		out.Close()
		return nil, errors.Join(fmt.Errorf("cgroup: %w", err), g.Remove())
	}
	if dir != nil {
		defer dir.Close()
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(dir.Fd())
	}
	c, err := startChild(cmd, out)
	if err != nil {
		return nil, errors.Join(err, g.Remove())
	}
	c.cg = g
	if dir == nil {
		// (A process that has already exited cannot be placed: it ends as it ended, and the
		// host classifies that, not the placement; its empty cgroup goes with it.)
		if err := g.Add(c.pid); err != nil && !errors.Is(err, syscall.ESRCH) {
			_ = pgroup.Signal(c.pid, syscall.SIGKILL)
			<-c.waited
			return nil, errors.Join(fmt.Errorf("placing process %d in its cgroup: %w", c.pid, err), g.Remove())
		}
	}
	return c, nil
}

// dropCgroup kills what is left in the process's cgroup, descendants that left its process
// group included, and removes the cgroup. It returns the cgroup's OOM-kill count.
func (c *child) dropCgroup(log *zap.Logger) (oomKills uint64) {
	if c.cg == nil {
		return 0
	}
	if err := c.cg.Kill(); err != nil {
		log.Warn("killing a lane's cgroup", zap.Int("pid", c.pid), zap.Error(err))
	}
	oomKills = c.cg.OOMKills()
	if err := c.cg.Remove(); err != nil {
		log.Warn("removing a lane's cgroup", zap.Int("pid", c.pid), zap.Error(err))
	}
	return oomKills
}

// peerCheck admits the process that connected to a rendezvous meant for process pid: it must
// run as this host's user and be pid or one of its descendants (a wrapper in Prefix may
// fork, or start it in a new pid namespace: a child namespace's processes keep a pid here).
// A peer whose pid the kernel cannot map into this host's pid namespace (reported as 0) is
// refused before it gets here (shm.Rendezvous): a lane is always a descendant of its host,
// so such a peer is a stranger, in a namespace beside or above the host's. The peer must
// then prove itself with the rendezvous's key too, which only the lane was given.
func peerCheck(pid int) func(shm.Peer) error {
	return func(p shm.Peer) error {
		if p.UID != os.Geteuid() {
			return fmt.Errorf("peer runs as uid %d, the host as %d", p.UID, os.Geteuid())
		}
		if p.PID > 0 && descendsFrom(p.PID, pid) {
			return nil
		}
		return fmt.Errorf("peer pid %d is not lane process %d or one of its descendants", p.PID, pid)
	}
}

// descendsFrom reports whether pid is ancestor or one of its descendants, following parent
// pids through /proc.
func descendsFrom(pid, ancestor int) bool {
	for range 64 {
		if pid == ancestor {
			return true
		}
		if pid <= 1 {
			return false
		}
		var err error
		if _, pid, err = procfs.Stat(pid); err != nil {
			return false
		}
	}
	return false
}

// frozen reports whether process pid is stopped (SIGSTOP, a debugger): a spare in that state
// would make a restart wait for nothing.
func frozen(pid int) bool {
	state, _, err := procfs.Stat(pid)
	return err == nil && (state == 'T' || state == 't')
}

// Cgroups is where a pool's lane processes get cgroups of their own: the pool's cgroup, one
// child per lane process (internal/cgroup).
type Cgroups struct{ tree *cgroup.Tree }

// CgroupLimits are what each lane process's cgroup enforces (0: no limit).
type CgroupLimits struct {
	Memory    int64  // bytes (no swap)
	Pids      int64  // processes and threads
	CPUQuota  int64  // microseconds of CPU time per CPUPeriod
	CPUPeriod uint64 // microseconds; 0: 100000
}

// OpenCgroups makes the pool's cgroup name under parent (a path inside the hierarchy; "":
// the host's own cgroup).
func OpenCgroups(name, parent string, l CgroupLimits) (*Cgroups, error) {
	tree, err := cgroup.Open(name, cgroup.Options{Parent: parent}, cgroup.Limits{
		Memory: l.Memory, Pids: l.Pids, CPUQuota: l.CPUQuota, CPUPeriod: l.CPUPeriod,
	})
	if err != nil {
		return nil, err
	}
	return &Cgroups{tree: tree}, nil
}

// Version names the cgroup version in force: "cgroup v1" or "cgroup v2".
func (c *Cgroups) Version() string { return c.tree.Version().String() }

// Close removes the pool's cgroups, killing whatever still runs in them.
func (c *Cgroups) Close() error { return c.tree.Close() }
