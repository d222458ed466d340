//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Tree is one pool's cgroup directory: every lane process gets a Group under it. It is safe
// for concurrent use.
type Tree struct {
	version Version
	name    string
	limits  Limits

	// v1: the hierarchies used, and the pool's path in each.
	hier  cgroup1.Hierarchy
	path1 cgroup1.Path
	pool1 cgroup1.Cgroup

	// v2: the mount, the pool's manager and its directory (containerd keeps a manager's
	// path to itself; CLONE_INTO_CGROUP needs the directory).
	mount string
	pool2 *cgroup2.Manager
	dir2  string

	mu     sync.Mutex
	seq    int
	groups map[*Group]bool
	closed bool
}

// Open creates the pool's cgroup directory, named name, under opts.Parent. An error wraps
// ErrUnavailable when the host cannot give lanes cgroups with these limits (no cgroup
// hierarchy, a controller missing, no permission), so that the caller can fall back.
func Open(name string, opts Options, l Limits) (*Tree, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroup: bad name %q", name)
	}
	mode := cgroups.Mode()
	v := opts.Version
	if v == Auto {
		switch mode {
		case cgroups.Unified:
			v = V2
		case cgroups.Legacy, cgroups.Hybrid:
			v = V1
		default:
			return nil, fmt.Errorf("%w: no cgroup hierarchy is mounted", ErrUnavailable)
		}
	}
	t := &Tree{version: v, name: name, limits: l, groups: map[*Group]bool{}}
	var err error
	if v == V2 {
		err = t.openV2(opts, mode)
	} else {
		err = t.openV1(opts)
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Version is the cgroup version the tree uses.
func (t *Tree) Version() Version { return t.version }

// Name is the pool's directory name.
func (t *Tree) Name() string { return t.name }

func (t *Tree) openV2(opts Options, mode cgroups.CGMode) error {
	t.mount = opts.Mount
	if t.mount == "" {
		t.mount = "/sys/fs/cgroup"
		if mode == cgroups.Hybrid {
			t.mount = "/sys/fs/cgroup/unified"
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(t.mount, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("%w: no cgroup v2 hierarchy at %s", ErrUnavailable, t.mount)
	}
	parent := opts.Parent
	if parent == "" {
		own, err := ownV2()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		parent = own
	}
	if fi, err := os.Stat(filepath.Join(t.mount, parent)); err != nil || !fi.IsDir() {
		return fmt.Errorf("%w: no parent cgroup %s in %s", ErrUnavailable, parent, t.mount)
	}
	// The pool's directory enables, in its parent's cgroup.subtree_control, the controllers
	// its lanes' limits need; each lane's directory then enables them in the pool's.
	group := path.Join("/", parent, t.name)
	m, err := cgroup2.NewManager(t.mount, group, resourcesV2(t.limits, false))
	if err != nil {
		return fmt.Errorf("%w: creating %s in %s: %v", ErrUnavailable, t.name, path.Join(t.mount, parent), err)
	}
	t.pool2, t.dir2 = m, filepath.Join(t.mount, group)
	return nil
}

// resourcesV2 is what a v2 directory gets: with values for a lane, with only the controllers
// (nil values) for the pool's directory, which its lanes' limits need enabled.
func resourcesV2(l Limits, values bool) *cgroup2.Resources {
	r := &cgroup2.Resources{}
	if l.Memory > 0 {
		r.Memory = &cgroup2.Memory{}
		if values {
			r.Memory.Max = &l.Memory
		}
	}
	if l.Pids > 0 {
		r.Pids = &cgroup2.Pids{}
		if values {
			r.Pids.Max = l.Pids
		}
	}
	if l.CPUQuota > 0 {
		r.CPU = &cgroup2.CPU{}
		if values {
			period := l.CPUPeriod
			if period == 0 {
				period = 100000
			}
			r.CPU.Max = cgroup2.NewCPUMax(&l.CPUQuota, &period)
		}
	}
	return r
}

// ownV2 is this process's cgroup in the v2 hierarchy ("0::/path" in /proc/self/cgroup).
func ownV2() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("this process is in no cgroup v2")
}

// v1 hierarchies knit uses: memory, pids and cpu for limits, freezer to kill a cgroup whose
// processes fork.
var v1Wanted = map[cgroup1.Name]bool{cgroup1.Memory: true, cgroup1.Pids: true, cgroup1.Cpu: true, cgroup1.Freezer: true}

func (t *Tree) openV1(opts Options) error {
	all, err := cgroup1.Default()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	var subs []cgroup1.Subsystem
	have := map[cgroup1.Name]bool{}
	for _, s := range all {
		if v1Wanted[s.Name()] {
			subs = append(subs, s)
			have[s.Name()] = true
		}
	}
	for name, need := range map[cgroup1.Name]bool{cgroup1.Memory: t.limits.Memory > 0, cgroup1.Pids: t.limits.Pids > 0, cgroup1.Cpu: t.limits.CPUQuota > 0} {
		if need && !have[name] {
			return fmt.Errorf("%w: no cgroup v1 %s hierarchy", ErrUnavailable, name)
		}
	}
	if len(subs) == 0 {
		return fmt.Errorf("%w: none of the cgroup v1 memory, pids, cpu, freezer hierarchies is mounted", ErrUnavailable)
	}
	t.hier = func() ([]cgroup1.Subsystem, error) { return subs, nil }
	parent := cgroup1.NestedPath("") // this process's cgroup in each hierarchy
	if opts.Parent != "" {
		parent = cgroup1.StaticPath(path.Join("/", opts.Parent))
	}
	// The parent must exist: making it would leave directories nobody removes.
	for _, s := range subs {
		d, err := dirV1(t.hier, parent, s.Name())
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return fmt.Errorf("%w: no parent cgroup %s", ErrUnavailable, d)
		}
	}
	t.path1 = func(n cgroup1.Name) (string, error) {
		p, err := parent(n)
		return path.Join(p, t.name), err
	}
	// A hierarchy where the directory cannot be made is an error, not one to skip: a lane
	// would escape its limit or its kill there.
	c, err := cgroup1.New(t.path1, &specs.LinuxResources{}, cgroup1.WithHierarchy(t.hier),
		cgroup1.InitOpts(func(c *cgroup1.InitConfig) error { c.InitCheck = nil; return nil }))
	if err != nil {
		return fmt.Errorf("%w: creating %s: %v", ErrUnavailable, t.name, err)
	}
	t.pool1 = c
	return nil
}

// Group is one lane process's cgroup.
type Group struct {
	tree *Tree
	name string

	v1      cgroup1.Cgroup
	path1   cgroup1.Path
	v2      *cgroup2.Manager
	dir     string // v2: the directory
	mu      sync.Mutex
	removed bool
}

// New creates a cgroup, with the tree's limits, for one lane process.
func (t *Tree) New() (*Group, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errors.New("cgroup: the pool's cgroup is closed")
	}
	t.seq++
	g := &Group{tree: t, name: fmt.Sprintf("p%d", t.seq)}
	t.mu.Unlock()
	if err := g.create(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed { // Close ran meanwhile: it did not see this one
		_ = g.remove()
		return nil, errors.New("cgroup: the pool's cgroup is closed")
	}
	t.groups[g] = true
	return g, nil
}

func (g *Group) create() error {
	t, l := g.tree, g.tree.limits
	if t.version == V2 {
		m, err := t.pool2.NewChild(g.name, resourcesV2(l, true))
		if err != nil {
			return fmt.Errorf("cgroup v2: %w", err)
		}
		g.v2 = m
		g.dir = filepath.Join(t.dir2, g.name)
		// No swap: a limit the lane could swap past is no limit (only where swap is
		// accounted: the file exists).
		if l.Memory > 0 {
			if _, err := os.Stat(filepath.Join(g.dir, "memory.swap.max")); err == nil {
				zero := int64(0)
				if err := m.Update(&cgroup2.Resources{Memory: &cgroup2.Memory{Swap: &zero}}); err != nil {
					_ = m.Delete()
					return fmt.Errorf("cgroup v2: memory.swap.max: %w", err)
				}
			}
		}
		return nil
	}
	r := &specs.LinuxResources{}
	if l.Memory > 0 {
		r.Memory = &specs.LinuxMemory{Limit: &l.Memory}
		if mp, err := t.pool1Dir(cgroup1.Memory); err == nil {
			if _, err := os.Stat(filepath.Join(mp, "memory.memsw.limit_in_bytes")); err == nil {
				r.Memory.Swap = &l.Memory // memory+swap: the same bound, so no swap
			}
		}
	}
	if l.Pids > 0 {
		r.Pids = &specs.LinuxPids{Limit: &l.Pids}
	}
	if l.CPUQuota > 0 {
		period := l.CPUPeriod
		if period == 0 {
			period = 100000
		}
		r.CPU = &specs.LinuxCPU{Quota: &l.CPUQuota, Period: &period}
	}
	pool := t.path1
	g.path1 = func(n cgroup1.Name) (string, error) {
		p, err := pool(n)
		return path.Join(p, g.name), err
	}
	c, err := cgroup1.New(g.path1, r, cgroup1.WithHierarchy(t.hier),
		cgroup1.InitOpts(func(c *cgroup1.InitConfig) error { c.InitCheck = nil; return nil }))
	if err != nil {
		// What was made in some hierarchies before the error goes again.
		if c2, lerr := cgroup1.Load(g.path1, cgroup1.WithHierarchy(t.hier)); lerr == nil {
			_ = c2.Delete()
		}
		return fmt.Errorf("cgroup v1: %w", err)
	}
	g.v1 = c
	return nil
}

// pool1Dir is the pool's directory in one v1 hierarchy.
func (t *Tree) pool1Dir(n cgroup1.Name) (string, error) {
	return dirV1(t.hier, t.path1, n)
}

func dirV1(h cgroup1.Hierarchy, p cgroup1.Path, n cgroup1.Name) (string, error) {
	subs, err := h()
	if err != nil {
		return "", err
	}
	for _, s := range subs {
		if s.Name() != n {
			continue
		}
		ps, ok := s.(interface{ Path(string) string })
		if !ok {
			break
		}
		rel, err := p(n)
		if err != nil {
			return "", err
		}
		return ps.Path(rel), nil
	}
	return "", fmt.Errorf("cgroup v1: no %s hierarchy", n)
}

// Version is the group's cgroup version.
func (g *Group) Version() Version { return g.tree.version }

// Dir opens the group's directory for SysProcAttr.CgroupFD (clone3's CLONE_INTO_CGROUP): a
// process started so is in the group from its first instruction. v1 has no such thing: it
// returns nil, and the caller places the process with Add once it has started.
func (g *Group) Dir() (*os.File, error) {
	if g.v2 == nil {
		return nil, nil
	}
	fd, err := unix.Open(g.dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: g.dir, Err: err}
	}
	return os.NewFile(uintptr(fd), g.dir), nil
}

// Add moves process pid into the group (its cgroup.procs, in every hierarchy). Processes it
// starts from then on are born in the group; any it started before are not moved.
func (g *Group) Add(pid int) error {
	if g.v2 != nil {
		return g.v2.AddProc(uint64(pid))
	}
	return g.v1.AddProc(uint64(pid))
}

// Pids lists the processes in the group.
func (g *Group) Pids() ([]int, error) {
	var pids []int
	if g.v2 != nil {
		ps, err := g.v2.Procs(true)
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			pids = append(pids, int(p))
		}
		return pids, nil
	}
	for _, s := range g.v1.Subsystems() {
		ps, err := g.v1.Processes(s.Name(), true)
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			pids = append(pids, p.Pid)
		}
		return pids, nil
	}
	return nil, nil
}

// OOMKills is how many processes the kernel's out-of-memory killer has killed in the group
// (v2 memory.events oom_kill, v1 memory.oom_control oom_kill); 0 when the group has no
// memory controller.
func (g *Group) OOMKills() uint64 {
	var file, dir string
	if g.v2 != nil {
		dir, file = g.dir, "memory.events"
	} else {
		d, err := dirV1(g.tree.hier, g.path1, cgroup1.Memory)
		if err != nil {
			return 0
		}
		dir, file = d, "memory.oom_control"
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0
	}
	n, _ := parseKV(string(b), "oom_kill")
	return n
}

// Kill sends SIGKILL to every process in the group and in every cgroup beneath it (a lane
// may make cgroups inside its own and move its children there), and waits (KillTimeout at
// most) until none is left. v2 writes cgroup.kill, which reaches the whole subtree and
// processes forking meanwhile too. v1 freezes the group where the freezer hierarchy is
// mounted (which freezes the cgroups beneath it too), signals every pid in the
// cgroup.procs of each cgroup of the subtree, in every hierarchy, and thaws it, until they
// are all empty.
func (g *Group) Kill() error {
	return killAll(g.dirs(), g.freezerDir(), g.v2 != nil, g.name)
}

// dirs is the group's directory in each hierarchy it is in.
func (g *Group) dirs() []string {
	if g.v2 != nil {
		return []string{g.dir}
	}
	return dirsV1(g.tree.hier, g.path1)
}

// freezerDir is the group's v1 freezer directory, or "" (v2, or no freezer hierarchy).
func (g *Group) freezerDir() string {
	if g.v2 != nil {
		return ""
	}
	d, err := dirV1(g.tree.hier, g.path1, cgroup1.Freezer)
	if err != nil {
		return ""
	}
	return d
}

// dirsV1 is p's directory in every hierarchy of h.
func dirsV1(h cgroup1.Hierarchy, p cgroup1.Path) []string {
	subs, err := h()
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range subs {
		if d, err := dirV1(h, p, s.Name()); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// killAll kills every process in the cgroups at and beneath tops (one cgroup's directory in
// each hierarchy) and waits, KillTimeout at most, until they are empty. On v2 cgroup.kill
// reaches the whole subtree at once (Linux 5.14; before it, the processes are signalled one
// by one, like v1's, in a frozen subtree). On v1, freezer (the cgroup's freezer directory,
// "" if none) is frozen while its processes are signalled, so that none forks meanwhile.
// name names the cgroup in the error, which lists the processes left.
func killAll(tops []string, freezer string, v2 bool, name string) error {
	if len(tops) == 0 {
		return nil
	}
	deadline := time.Now().Add(KillTimeout)
	oneByOne := !v2
	if v2 {
		if err := os.WriteFile(filepath.Join(tops[0], "cgroup.kill"), []byte("1"), 0); err != nil {
			if !exists(tops[0]) {
				return nil // nothing left to kill: the cgroup is gone
			}
			oneByOne = true
		}
	}
	delay := 100 * time.Microsecond
	for {
		pids, err := pidsBeneath(tops)
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", name, err)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %d processes still there after %v: %v", name, len(pids), KillTimeout, pids)
		}
		if oneByOne {
			thaw := freeze(freezer, v2, tops[0])
			for _, pid := range pids {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
			thaw()
		}
		// The kernel takes a moment to tear a killed process down.
		time.Sleep(delay)
		delay = min(2*delay, 10*time.Millisecond)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// pidsBeneath lists, without repeats, the processes in the cgroups at and beneath each of
// tops. A top that does not exist holds none.
func pidsBeneath(tops []string) ([]int, error) {
	seen := map[int]bool{}
	var pids []int
	for _, top := range tops {
		err := filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, os.ErrNotExist) { // removed meanwhile
					return nil
				}
				return err
			}
			if !d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENODEV) { // removed meanwhile
				return nil
			}
			if err != nil {
				return err
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return pids, nil
}

// freeze freezes a subtree so that none of its processes forks while they are being killed,
// and returns the thaw (killed processes die once thawed): v1 through the freezer
// directory's freezer.state (nothing without one), v2 through top's cgroup.freeze. It
// writes the state itself rather than through cgroup1's Freeze, which waits without bound
// for FROZEN: a process in uninterruptible sleep can keep a group FREEZING for as long as it
// sleeps.
func freeze(freezer string, v2 bool, top string) (thaw func()) {
	file, frozen, thawed := filepath.Join(freezer, "freezer.state"), "FROZEN", "THAWED"
	if v2 {
		file, frozen, thawed = filepath.Join(top, "cgroup.freeze"), "1", "0"
	} else if freezer == "" {
		return func() {}
	}
	if os.WriteFile(file, []byte(frozen), 0) != nil {
		return func() {}
	}
	return func() { _ = os.WriteFile(file, []byte(thawed), 0) }
}

// removeAll removes the cgroup directories at and beneath each of tops, deepest first (a
// cgroup directory goes with rmdir, and only once it has no process and no child). A
// directory already gone is no error. It reports every directory it could not remove.
func removeAll(tops []string) error {
	var errs []error
	for _, top := range tops {
		var dirs []string
		err := filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("cgroup: listing %s: %w", top, err))
		}
		for i := len(dirs) - 1; i >= 0; i-- { // WalkDir lists a directory before its children
			if err := rmdir(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// rmdir removes an empty cgroup directory. A cgroup whose last process was just killed may
// still count it for a moment (EBUSY): it tries again, KillTimeout at most.
func rmdir(dir string) error {
	delay := 100 * time.Microsecond
	deadline := time.Now().Add(KillTimeout)
	for {
		err := unix.Rmdir(dir)
		switch {
		case err == nil || errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY) && time.Now().Before(deadline):
			time.Sleep(delay)
			delay = min(2*delay, 10*time.Millisecond)
		default:
			return fmt.Errorf("cgroup: removing %s: %w", dir, err)
		}
	}
}

// Remove kills what is left in the group and removes its directory. Once it has succeeded
// it does nothing; until then the tree's Close tries again.
func (g *Group) Remove() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.removed {
		return nil
	}
	if err := g.remove(); err != nil {
		return err
	}
	g.removed = true
	g.tree.mu.Lock()
	delete(g.tree.groups, g)
	g.tree.mu.Unlock()
	return nil
}

func (g *Group) remove() error {
	if err := g.Kill(); err != nil {
		return err // its directories cannot go while processes are in them
	}
	return removeAll(g.dirs())
}

// Close kills every process in the pool's cgroup and beneath it — in the lanes' groups, and
// in any cgroup a lane made beside them — and removes every directory there and the pool's
// own. It is idempotent. Its error says what it could not kill or remove.
func (t *Tree) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	var left []*Group
	for g := range t.groups {
		left = append(left, g)
	}
	t.mu.Unlock()
	// The whole subtree at once: a process a lane moved beside its own group would run on
	// otherwise while its siblings die, and keep the pool's directory.
	if err := killAll(t.poolDirs(), t.poolFreezer(), t.version == V2, t.name); err != nil {
		return err
	}
	var errs []error
	for _, g := range left {
		errs = append(errs, g.Remove())
	}
	errs = append(errs, removeAll(t.poolDirs()))
	return errors.Join(errs...)
}

// poolDirs is the pool's directory in each hierarchy.
func (t *Tree) poolDirs() []string {
	if t.version == V2 {
		return []string{t.dir2}
	}
	return dirsV1(t.hier, t.path1)
}

// poolFreezer is the pool's v1 freezer directory, or "".
func (t *Tree) poolFreezer() string {
	if t.version == V2 {
		return ""
	}
	d, err := t.pool1Dir(cgroup1.Freezer)
	if err != nil {
		return ""
	}
	return d
}

// poolName matches the directories knit pools make: knit-<host pid>-<pool>.
var poolName = regexp.MustCompile(`^knit-([0-9]+)-[0-9]+$`)

// Sweep removes the pool directories (knit-<pid>-<pool>) that hosts which have died left
// under the parent where Open would create one, killing whatever still runs in them, and
// returns their paths. A host killed with SIGKILL cannot remove its own; its lanes died with
// it (Pdeathsig), but a descendant that left their process groups may still run there. It
// only touches directories named so whose pid names no living process.
func Sweep(opts Options) ([]string, error) {
	t := &Tree{groups: map[*Group]bool{}}
	mode := cgroups.Mode()
	t.version = opts.Version
	if t.version == Auto {
		switch mode {
		case cgroups.Unified:
			t.version = V2
		case cgroups.Legacy, cgroups.Hybrid:
			t.version = V1
		default:
			return nil, nil
		}
	}
	// The parent directory, in each hierarchy.
	var parents []string
	if t.version == V2 {
		t.mount = opts.Mount
		if t.mount == "" {
			t.mount = "/sys/fs/cgroup"
			if mode == cgroups.Hybrid {
				t.mount = "/sys/fs/cgroup/unified"
			}
		}
		parent := opts.Parent
		if parent == "" {
			own, err := ownV2()
			if err != nil {
				return nil, nil
			}
			parent = own
		}
		parents = append(parents, filepath.Join(t.mount, parent))
	} else {
		all, err := cgroup1.Default()
		if err != nil {
			return nil, nil
		}
		var subs []cgroup1.Subsystem
		for _, s := range all {
			if v1Wanted[s.Name()] {
				subs = append(subs, s)
			}
		}
		t.hier = func() ([]cgroup1.Subsystem, error) { return subs, nil }
		t.path1 = cgroup1.NestedPath("")
		if opts.Parent != "" {
			t.path1 = cgroup1.StaticPath(path.Join("/", opts.Parent))
		}
		for _, s := range subs {
			if d, err := dirV1(t.hier, t.path1, s.Name()); err == nil {
				parents = append(parents, d)
			}
		}
	}
	dead := map[string]bool{}
	var names []string
	for _, dir := range parents {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			m := poolName.FindStringSubmatch(e.Name())
			if m == nil || !e.IsDir() || dead[e.Name()] {
				continue
			}
			pid, err := strconv.Atoi(m[1])
			if err != nil || pid == os.Getpid() || unix.Kill(pid, 0) != unix.ESRCH {
				continue
			}
			// A pid this host cannot see may be a live host in another pid namespace
			// sharing the parent, its lanes in the directory, as invisible to this host as
			// it is. A dead host of this namespace left its directory empty, or holding
			// processes this host can see (escapees): only those are swept.
			if any, visible := populated(filepath.Join(dir, e.Name())); any && !visible {
				continue
			}
			dead[e.Name()] = true
			names = append(names, e.Name())
		}
	}
	var removed []string
	var errs []error
	for _, name := range names {
		if err := t.sweepPool(name, parents); err != nil {
			errs = append(errs, err)
			continue
		}
		for _, dir := range parents {
			removed = append(removed, filepath.Join(dir, name))
		}
	}
	return removed, errors.Join(errs...)
}

// sweepPool removes a dead host's pool directory, in every hierarchy: it kills everything
// at and beneath it (its lanes' groups, and any cgroup a lane made) like Tree.Close, and
// removes every directory there.
func (t *Tree) sweepPool(name string, parents []string) error {
	var tops []string
	for _, dir := range parents {
		tops = append(tops, filepath.Join(dir, name))
	}
	freezer := ""
	if t.version == V1 {
		parent := t.path1
		pool := func(n cgroup1.Name) (string, error) {
			p, err := parent(n)
			return path.Join(p, name), err
		}
		if d, err := dirV1(t.hier, pool, cgroup1.Freezer); err == nil {
			freezer = d
		}
	}
	if err := killAll(tops, freezer, t.version == V2, name); err != nil {
		return err
	}
	return removeAll(tops)
}

// populated reports whether any process is in the cgroup at dir or beneath it, and whether
// this host can see one of them (cgroup.procs shows one it cannot as 0, or not at all).
func populated(dir string) (any, visible bool) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			any = true
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 && unix.Kill(pid, 0) != unix.ESRCH {
				visible = true
				return filepath.SkipAll
			}
		}
		return nil
	})
	return any, visible
}
