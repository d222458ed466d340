package lifecycle

import (
	"sync"

	"go.uber.org/zap"

	"github.com/knitgo/knit/internal/hostguard"
	"github.com/knitgo/knit/internal/logging"
)

// HostLimits guards the host's own resource limits against the processes it starts: a lane
// that is not under the seccomp preset can lower them with prlimit64 (its user may), and
// leave the host unable to open a file, grow its heap or start a lane. A pool records them
// when it starts (WatchHostLimits) and checks them at each watchdog tick (Check), which
// raises back what was lowered. See internal/hostguard for what cannot be raised back.
type HostLimits struct {
	snap   *hostguard.Snapshot
	log    *zap.Logger
	mu     sync.Mutex
	logged map[string]bool
}

// WatchHostLimits records this process's resource limits now. log is the pool's lifecycle
// logger. Where there are no limits to watch it returns the reason, and a nil *HostLimits,
// whose Check does nothing.
func WatchHostLimits(log *zap.Logger) (*HostLimits, error) {
	s, err := hostguard.Take()
	if err != nil {
		return nil, err
	}
	return &HostLimits{snap: s, log: log, logged: map[string]bool{}}, nil
}

// Check raises back every limit lowered since WatchHostLimits and returns what it found. It
// logs each limit the first time it finds it lowered at Error — another process of the
// host's user changed the host's limits, a lane most likely — and later times at Debug, so
// that a lane lowering them in a loop cannot flood the log. It costs 16 prlimit calls.
func (h *HostLimits) Check() []hostguard.Change {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	changes := h.snap.Restore()
	for _, c := range changes {
		fields := []zap.Field{zap.String("resource", c.Resource), zap.Stringer("was", c.Want),
			zap.Stringer("found", c.Found), zap.Stringer("now", c.Now)}
		if c.Err != nil {
			fields = append(fields, zap.NamedError("not_restored", c.Err))
		}
		const msg = "a process changed this host's resource limit: raised back"
		if !h.logged[c.Resource] {
			h.logged[c.Resource] = true
			h.log.Error(msg, fields...)
		} else if ce := logging.Debug(h.log, msg); ce != nil {
			ce.Write(fields...)
		}
	}
	return changes
}
