//go:build linux

package hostguard

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// resources are the limits a Snapshot keeps (every one Linux has, RLIMIT_NLIMITS = 16).
var resources = []struct {
	id   int
	name string
}{
	{unix.RLIMIT_CPU, "RLIMIT_CPU"}, {unix.RLIMIT_FSIZE, "RLIMIT_FSIZE"}, {unix.RLIMIT_DATA, "RLIMIT_DATA"},
	{unix.RLIMIT_STACK, "RLIMIT_STACK"}, {unix.RLIMIT_CORE, "RLIMIT_CORE"}, {unix.RLIMIT_RSS, "RLIMIT_RSS"},
	{unix.RLIMIT_NPROC, "RLIMIT_NPROC"}, {unix.RLIMIT_NOFILE, "RLIMIT_NOFILE"}, {unix.RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK"},
	{unix.RLIMIT_AS, "RLIMIT_AS"}, {unix.RLIMIT_LOCKS, "RLIMIT_LOCKS"}, {unix.RLIMIT_SIGPENDING, "RLIMIT_SIGPENDING"},
	{unix.RLIMIT_MSGQUEUE, "RLIMIT_MSGQUEUE"}, {unix.RLIMIT_NICE, "RLIMIT_NICE"}, {unix.RLIMIT_RTPRIO, "RLIMIT_RTPRIO"},
	{unix.RLIMIT_RTTIME, "RLIMIT_RTTIME"},
}

// Snapshot is this process's resource limits at one moment.
type Snapshot struct {
	limits map[int]Limit
}

// Take records this process's resource limits.
func Take() (*Snapshot, error) {
	s := &Snapshot{limits: map[int]Limit{}}
	for _, r := range resources {
		l, err := get(r.id)
		if err != nil {
			return nil, fmt.Errorf("knit/hostguard: %s: %w", r.name, err)
		}
		s.limits[r.id] = l
	}
	return s, nil
}

// Restore compares this process's limits with the snapshot and raises each one found lower
// back: the soft limit always can be, up to the hard limit; a hard limit only with
// CAP_SYS_RESOURCE. Where it cannot, it raises the soft limit as far as the hard one
// allows. It returns one Change per limit it found lowered (none: nothing was). A limit
// found higher is left alone: only a privileged process could have raised it.
func (s *Snapshot) Restore() []Change {
	var changes []Change
	for _, r := range resources {
		want := s.limits[r.id]
		found, err := get(r.id)
		if err != nil {
			changes = append(changes, Change{Resource: r.name, Want: want, Err: err})
			continue
		}
		if found.Soft >= want.Soft && found.Hard >= want.Hard {
			continue
		}
		c := Change{Resource: r.name, Want: want, Found: found}
		target := Limit{Soft: max(found.Soft, want.Soft), Hard: max(found.Hard, want.Hard)}
		if err := set(r.id, target); err != nil {
			// The hard limit cannot go up without CAP_SYS_RESOURCE: the soft one goes as
			// far as the hard one allows.
			c.Err = fmt.Errorf("its hard limit cannot be raised back from %s: %w", limitText(found.Hard), err)
			if err := set(r.id, Limit{Soft: min(want.Soft, found.Hard), Hard: found.Hard}); err != nil {
				c.Err = fmt.Errorf("%w; nor its soft limit: %w", c.Err, err)
			}
		}
		c.Now, _ = get(r.id)
		changes = append(changes, c)
	}
	return changes
}

func get(res int) (Limit, error) {
	var l unix.Rlimit
	if err := unix.Prlimit(0, res, nil, &l); err != nil {
		return Limit{}, err
	}
	return Limit{Soft: l.Cur, Hard: l.Max}, nil
}

func set(res int, l Limit) error {
	return unix.Prlimit(0, res, &unix.Rlimit{Cur: l.Soft, Max: l.Hard}, nil)
}
