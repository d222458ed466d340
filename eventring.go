package knit

import (
	"fmt"
	"os"
	"sync"
)

// recentEvents is how many lifecycle events a pool keeps (RecentEvents).
const recentEvents = 256

// eventRing keeps a pool's last recentEvents lifecycle events, numbered from 1, for
// RecentEvents (the inspector's timeline). The supervisor's goroutines add to it (never the call path); adding takes a
// mutex held for a copy and never waits for a reader.
type eventRing struct {
	mu     sync.Mutex
	buf    []Event
	seq    uint64        // the number of the last event added
	notify chan struct{} // closed by the next add; nil until someone waits
}

// NumberedEvent is a lifecycle event and its number in the pool's log of recent events.
type NumberedEvent struct {
	Seq uint64
	Event
}

func (r *eventRing) add(e Event) {
	r.mu.Lock()
	if r.buf == nil {
		r.buf = make([]Event, recentEvents)
	}
	r.seq++
	r.buf[r.seq%recentEvents] = e
	if r.notify != nil {
		close(r.notify)
		r.notify = nil
	}
	r.mu.Unlock()
}

// since returns the events numbered after seq that the ring still holds, oldest first, and
// how many after seq it no longer holds.
func (r *eventRing) since(seq uint64) (events []NumberedEvent, missed uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq >= r.seq {
		return nil, 0
	}
	first := seq + 1
	if r.seq >= recentEvents && first <= r.seq-recentEvents {
		missed = r.seq - recentEvents + 1 - first
		first = r.seq - recentEvents + 1
	}
	events = make([]NumberedEvent, 0, r.seq-first+1)
	for s := first; s <= r.seq; s++ {
		events = append(events, NumberedEvent{Seq: s, Event: r.buf[s%recentEvents]})
	}
	return events, missed
}

// last returns the number of the last event added and a channel closed when the next one
// is.
func (r *eventRing) last() (uint64, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.notify == nil {
		r.notify = make(chan struct{})
	}
	return r.seq, r.notify
}

// RecentEvents returns the lifecycle events numbered after seq that the pool still keeps
// (its last 256, numbered from 1), oldest first, and how many events after seq it no
// longer keeps. Unlike Events, it drops nothing a slow reader has not read: a reader that
// comes back with the number of the last event it saw learns what it missed. The
// inspector (package inspect) draws its timeline from it.
func (p *Pool) RecentEvents(seq uint64) (events []NumberedEvent, missed uint64) {
	return p.eventLog.since(seq)
}

// LastEvent returns the number of the pool's last lifecycle event (0: none yet) and a
// channel closed when the next one is added.
func (p *Pool) LastEvent() (seq uint64, next <-chan struct{}) { return p.eventLog.last() }

// Name is Config.Name, or else "knit-pool-<pid>-<n>", unique within this process: it names
// the pool in its logs (field "pool"), its metrics (attribute knit.pool) and the
// inspector.
func (p *Pool) Name() string {
	if p.cfg.Name != "" {
		return p.cfg.Name
	}
	return p.actorName()
}

// actorName names the pool's supervisor actor, unique within this process whatever
// Config.Name says ("knit-pool-<pid>-<n>").
// and its inspector go by it.
func (p *Pool) actorName() string { return fmt.Sprintf("knit-pool-%d-%d", os.Getpid(), p.id) }

// Config returns the pool's configuration, with every default filled in.
func (p *Pool) Config() Config { return p.cfg }

// Closed returns a channel closed once Close has finished.
func (p *Pool) Closed() <-chan struct{} { return p.closeDone }
