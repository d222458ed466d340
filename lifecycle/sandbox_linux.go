//go:build linux

package lifecycle

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/knitgo/knit/internal/privs"
	"github.com/knitgo/knit/internal/seccompguard"
)

// How the sandbox reaches every thread of a lane. Landlock's landlock_restrict_self and
// prctl(PR_SET_NO_NEW_PRIVS) act on the calling thread only, and a Go lane has several
// threads by the time it boots. go-landlock runs both on every thread at once: through
// LANDLOCK_RESTRICT_SELF_TSYNC on ABI 8 and later, and through libpsx before — which, in a
// binary with cgo (every `go test -race` binary is one), interrupts each thread with a
// signal and has it make the call, so syscall.AllThreadsSyscall's ENOTSUP under cgo does not
// arise (the lane tests run with -race and check it). A re-exec from a locked, restricted
// thread is therefore not needed. The seccomp filters use SECCOMP_FILTER_FLAG_TSYNC, which
// the kernel applies to all threads; they go on last, so that go-landlock's all-thread
// machinery (libpsx signals every thread) runs unfiltered. Threads started later inherit
// both layers.

// landlockNeeds is the Landlock ABI a required policy needs: 3 for truncation (before it, a
// read-only file could be truncated), 4 when TCP is denied too.
func landlockNeeds(l Landlock) int {
	if l.AllowNetwork {
		return 3
	}
	return 4
}

// landlockABI is the kernel's Landlock ABI version, 0 when Landlock is not built in or not
// enabled at boot (the lsm= list).
func landlockABI() int {
	v, err := llsys.LandlockGetABIVersion()
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// landlockGaps lists what a Landlock policy cannot enforce on a kernel with ABI abi.
func landlockGaps(l Landlock, abi int) []string {
	if abi < 1 {
		return []string{"everything: Landlock is not enabled in this kernel"}
	}
	var gaps []string
	if abi < 3 {
		gaps = append(gaps, "truncating files (ABI 3)")
	}
	if abi < 4 && !l.AllowNetwork {
		gaps = append(gaps, "denying TCP bind and connect (ABI 4)")
	}
	if abi < 5 {
		gaps = append(gaps, "ioctl on devices (ABI 5)")
	}
	if abi < 6 {
		gaps = append(gaps, "signals and abstract unix sockets outside the lane (ABI 6)")
	}
	return gaps
}

// seccompArgsOK: the preset checks clone's flags in its first argument, which is where they
// are on every architecture Go supports except s390x, and the process filter
// (seccompguard.DenyOthers) knows the architecture's argument layout and ioctl numbers.
var seccompArgsOK = runtime.GOARCH != "s390x" && seccompguard.OthersSupported()

// scopeNeeds is the Landlock ABI the seccomp preset's process scope needs (applyScope): 2,
// where the "refer" right exists, so that renames and links between directories keep
// working in the domain (on ABI 1 a domain refuses every one).
const scopeNeeds = 2

// scopeGap is what the seccomp preset does not enforce without its process scope.
const scopeGap = "writes beneath /proc and /sys, and other processes' /proc/<pid>/mem, environ and fd (Landlock ABI 2)"

// SandboxDowngrades lists, for each best-effort layer of s, what this kernel will not
// enforce; NewPool logs it once. Lanes run on the host's kernel, also behind a Prefix.
func SandboxDowngrades(s Sandbox) []string {
	return sandboxDowngrades(s, landlockABI())
}

func sandboxDowngrades(s Sandbox, abi int) []string {
	var out []string
	if s.Landlock.Mode == SandboxBestEffort {
		if gaps := landlockGaps(s.Landlock, abi); len(gaps) > 0 {
			out = append(out, fmt.Sprintf("Landlock ABI %d does not enforce %s", abi, strings.Join(gaps, ", ")))
		}
	}
	if s.Seccomp.Mode == SandboxBestEffort {
		if err := seccompUsable(); err != nil {
			out = append(out, fmt.Sprintf("seccomp preset not applied: %v", err))
		} else if abi < scopeNeeds {
			out = append(out, fmt.Sprintf("seccomp preset on Landlock ABI %d does not enforce %s", abi, scopeGap))
		}
	}
	return out
}

// applySandbox applies s to this whole process: Landlock first, or else the seccomp preset's
// process scope (a Landlock domain of the lane's own), then no_new_privs, the capability drop
// and non-dumpable, which every layer brings, and the seccomp filters last. It returns why a
// layer could not be applied; a best-effort layer the kernel lacks is logged at Debug and is
// no error.
func applySandbox(s *Sandbox, log *zap.Logger) error {
	if s == nil || !s.Enabled() {
		return nil
	}
	if err := s.Check(); err != nil {
		return err
	}
	abi := landlockABI()
	// The process scope's rules list the entries of /, which a Landlock policy applied
	// first may no longer let the lane read.
	var scope []landlock.Rule
	if s.Seccomp.Mode != SandboxOff && s.Landlock.Mode == SandboxOff && abi >= scopeNeeds {
		var err error
		if scope, err = scopeRules("/"); err != nil {
			return fmt.Errorf("sandbox: seccomp process scope: %w", err)
		}
	}
	// domain: the lane is in a Landlock domain (which go-landlock entered with no_new_privs
	// set on every thread).
	domain := false
	if s.Landlock.Mode != SandboxOff {
		got, err := applyLandlock(s.Landlock, abi)
		if err != nil {
			return err
		}
		domain = got > 0
		gaps := landlockGaps(s.Landlock, got)
		log.Debug("landlock applied", zap.Int("abi", got), zap.Stringer("mode", s.Landlock.Mode),
			zap.Strings("not_enforced", gaps))
	}
	seccompOK := false
	if s.Seccomp.Mode != SandboxOff {
		// Only a kernel (or architecture) without what the preset needs downgrades a
		// best-effort layer; a failure to install a filter the kernel supports fails the
		// lane in either mode.
		switch err := seccompUsable(); {
		case err != nil && s.Seccomp.Mode == SandboxRequired:
			return fmt.Errorf("sandbox: seccomp required: %w", err)
		case err != nil:
			log.Debug("seccomp preset not applied (best effort)", zap.Error(err))
		case domain:
			// The Landlock policy's domain does the process scope's work: it refuses
			// ptrace-mode access outside it, and its policy decides what the lane may
			// write, /proc and /sys included.
			seccompOK = true
		default:
			seccompOK = true
			scoped, err := applyScope(abi, s.Seccomp.Mode, scope)
			if err != nil {
				return err
			}
			domain = scoped
			if !scoped {
				log.Debug("seccomp preset without its process scope (best effort)", zap.Int("abi", abi),
					zap.String("not_enforced", scopeGap))
			}
		}
	}
	if err := dropPrivileges(!domain && !seccompOK); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if seccompOK {
		if err := applySeccomp(); err != nil {
			return fmt.Errorf("sandbox: seccomp: %w", err)
		}
		log.Debug("seccomp preset applied", zap.Stringer("mode", s.Seccomp.Mode))
	}
	return nil
}

// dropPrivileges is what every sandbox layer brings: the lane can gain no privilege through
// exec (no_new_privs), holds no capability on any thread (so a lane running as root cannot
// bypass the permission and ptrace checks that keep it off its host), and is not dumpable
// (so that other lanes of the same user cannot open its /proc/<pid>/mem; the host reads
// only its stat and statm, which stay readable). Not dumpable also means no core dump,
// whatever Limits.CoreDumps says. Each all-thread call signals every thread of the lane, so
// no_new_privs is set here only when nothing else sets it on every thread (nnp): entering a
// Landlock domain does, and so does the seccomp filter (TSYNC) installed next.
func dropPrivileges(nnp bool) error {
	if nnp {
		if err := privs.NoNewPrivs(); err != nil {
			return err
		}
	}
	if err := privs.DropCapabilities(); err != nil {
		return err
	}
	return privs.Undumpable()
}

// applyScope gives a lane under the seccomp preset a Landlock domain of its own that denies
// writing beneath /proc and /sys and allows every other write, on a kernel with Landlock ABI
// abi, allowing what rules (scopeRules) allow. It reports whether it did; without ABI 2 it
// fails a required preset.
//
// Why Landlock, for a seccomp preset: a filter cannot read paths, and what is left to keep
// a lane off its host goes through them. Being in a domain makes the kernel refuse the
// lane every ptrace-mode access to a process outside it — /proc/<host>/mem, environ, fd,
// the ptrace and process_vm calls — even when the host is dumpable and the lane runs as
// its user. Denying writes beneath /proc keeps it off the files a process of the same user
// may write without ptrace access (/proc/<host>/oom_score_adj, which would make the host
// the OOM killer's first choice; autogroup; sched), and beneath /sys off the cgroup
// filesystems (a lane making itself, or moving into, a cgroup outside its own) and the
// sysfs files root may write.
func applyScope(abi int, mode SandboxMode, rules []landlock.Rule) (bool, error) {
	if abi < scopeNeeds {
		if mode == SandboxRequired {
			return false, fmt.Errorf("sandbox: seccomp required: %w: kernel Landlock ABI %d, the preset needs %d for %s",
				errSandboxUnsupported, abi, scopeNeeds, scopeGap)
		}
		return false, nil
	}
	if err := (landlock.Config{HandledAccessFS: scopeAccess}).Restrict(rules...); err != nil {
		return false, fmt.Errorf("sandbox: seccomp process scope: Landlock: %w", err)
	}
	return true, nil
}

// scopeAccess is every right the process scope handles: all writes (not reads, execution or
// truncation, which needs write access to open anyway), and refer, so that renames
// between directories keep working.
const scopeAccess = landlock.AccessFSSet(llsys.AccessFSWriteFile | llsys.AccessFSRemoveDir | llsys.AccessFSRemoveFile |
	llsys.AccessFSMakeChar | llsys.AccessFSMakeDir | llsys.AccessFSMakeReg | llsys.AccessFSMakeSock |
	llsys.AccessFSMakeFifo | llsys.AccessFSMakeBlock | llsys.AccessFSMakeSym | llsys.AccessFSRefer)

// scopeRules allow every scope right beneath each entry of root but proc and sys (writing a
// file only, for an entry that is not a directory).
func scopeRules(root string) ([]landlock.Rule, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var rules []landlock.Rule
	for _, e := range entries {
		if e.Name() == "proc" || e.Name() == "sys" {
			continue
		}
		p := filepath.Join(root, e.Name())
		fi, err := os.Stat(p) // through a symbolic link (/lib -> usr/lib)
		if err != nil {
			continue // a dangling link: nothing there to write
		}
		if fi.IsDir() {
			rules = append(rules, landlock.PathAccess(scopeAccess, p))
		} else {
			rules = append(rules, landlock.PathAccess(llsys.AccessFSWriteFile, p))
		}
	}
	return rules, nil
}

// applyLandlock restricts the process to l on a kernel with Landlock ABI abi, and returns
// the ABI it was enforced with (0: not at all, in best-effort mode).
func applyLandlock(l Landlock, abi int) (int, error) {
	if need := landlockNeeds(l); l.Mode == SandboxRequired && abi < need {
		if abi == 0 {
			return 0, fmt.Errorf("sandbox: Landlock required: %w: Landlock is not enabled in this kernel (not built in, or not in the lsm= boot parameter)",
				errSandboxUnsupported)
		}
		return 0, fmt.Errorf("sandbox: Landlock required: %w: kernel Landlock ABI %d, the policy needs %d (%s)",
			errSandboxUnsupported, abi, need, strings.Join(landlockGaps(l, abi), ", "))
	}
	var rules []landlock.Rule
	for _, set := range []struct {
		paths      []string
		dirs, file func(...string) landlock.FSRule
	}{
		{l.ReadOnly, landlock.RODirs, landlock.ROFiles},
		{l.Writable, landlock.RWDirs, landlock.RWFiles},
	} {
		for _, p := range set.paths {
			fi, err := os.Stat(p)
			if err != nil {
				return 0, fmt.Errorf("sandbox: Landlock path: %w", err)
			}
			if fi.IsDir() {
				rules = append(rules, set.dirs(p))
			} else {
				rules = append(rules, set.file(p))
			}
		}
	}
	if abi == 0 { // best effort, and nothing to enforce with
		return 0, nil
	}
	// V6 is every right knit's policy uses: the filesystem through ioctl on devices, TCP,
	// signal and abstract socket scopes. BestEffort drops what the kernel lacks; in required
	// mode the check above made sure that is nothing the policy promises.
	cfg := landlock.V6.BestEffort()
	if l.AllowNetwork {
		cfg.HandledAccessNet = 0
	}
	if err := cfg.Restrict(rules...); err != nil {
		return 0, fmt.Errorf("sandbox: Landlock: %w", err)
	}
	return abi, nil
}

// seccompUsable says why the preset cannot be installed here, or nil.
func seccompUsable() error {
	if !seccompArgsOK {
		return fmt.Errorf("%w: the preset does not know clone's argument order on %s", errSandboxUnsupported, runtime.GOARCH)
	}
	if _, err := arch.GetInfo(""); err != nil {
		return fmt.Errorf("%w: %v", errSandboxUnsupported, err)
	}
	if !seccomp.Supported() {
		return fmt.Errorf("%w: the kernel has no seccomp filters", errSandboxUnsupported)
	}
	return nil
}

// seccompDenied are the system calls the preset makes fail with EPERM (see Seccomp). Names
// this architecture does not have (fork and vfork on arm64) are left out.
var seccompDenied = []string{
	"fork", "vfork", "execve", "execveat",
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
	"mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
	"fsmount", "fspick", "mount_setattr",
	"unshare", "setns",
	"kexec_load", "kexec_file_load", "reboot", "init_module", "finit_module", "delete_module",
	"bpf", "perf_event_open", "userfaultfd",
	"keyctl", "add_key", "request_key",
	"swapon", "swapoff", "acct", "quotactl",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"name_to_handle_at", "open_by_handle_at",
	"tkill", "pidfd_send_signal", // signals by thread id or pidfd: the lane needs neither
	// Other processes through a pidfd, or compared: the lane has no business with them.
	"pidfd_open", "kcmp", "process_madvise", "process_mrelease",
}

// seccompPolicy is the preset for this architecture.
func seccompPolicy() (seccomp.Policy, *arch.Info, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return seccomp.Policy{}, nil, err
	}
	var names []string
	for _, n := range seccompDenied {
		if _, ok := info.SyscallNames[n]; ok {
			names = append(names, n)
		}
	}
	// clone without CLONE_THREAD makes a process; with it, a thread.
	conditional := []seccomp.NameWithConditions{{
		Name: "clone",
		Conditions: seccomp.ArgumentConditions{{
			Argument: 0, Operation: seccomp.BitsNotSet, Value: unix.CLONE_THREAD,
		}},
	}}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{
				Action:             seccomp.ActionErrno, // EPERM
				Names:              names,
				NamesWithCondtions: conditional,
			},
			{
				// clone3 passes its flags in memory, where the filter cannot look: ENOSYS makes
				// glibc and others fall back to clone.
				Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS),
				Names:  []string{"clone3"},
			},
		},
	}, info, nil
}

// applySeccomp installs the preset on every thread: a guard against foreign ABIs
// (go-seccomp-bpf's filter lets calls of another architecture through to its default
// action, which for a deny list is to allow them), the deny list, and the process filter
// (seccompguard.DenyOthers), which lets the calls that take a pid reach only the lane
// itself. The lane's pid, which that filter is built with, cannot change once the filters
// are on: the lane can neither exec nor fork.
func applySeccomp() error {
	policy, info, err := seccompPolicy()
	if err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	if err := seccompguard.DenyForeignArch(uint32(info.ID)); err != nil {
		return err
	}
	if err := seccompguard.DenyOthers(os.Getpid()); err != nil {
		return err
	}
	// TSYNC also sets no_new_privs on the other threads. (go-seccomp-bpf does not look at
	// the thread id TSYNC returns when a thread cannot be synchronised; the guard above
	// checked it, and nothing can install a diverging filter in between.)
	return seccomp.LoadFilter(seccomp.Filter{
		NoNewPrivs: true,
		Flag:       seccomp.FilterFlagTSync,
		Policy:     policy,
	})
}
