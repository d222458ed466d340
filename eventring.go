package knit

import "sync"

// recentEvents is how many lifecycle events a pool keeps for the inspector.
const recentEvents = 256

// eventRing keeps a pool's last recentEvents lifecycle events, numbered from 1, for the
// inspector. The supervisor's goroutines add to it (never the call path); adding takes a
// mutex held for a copy and never waits for a reader.
type eventRing struct {
	mu     sync.Mutex
	buf    []Event
	seq    uint64        // the number of the last event added
	notify chan struct{} // closed by the next add; nil until someone waits
}

// seqEvent is an event and its number in the ring.
type seqEvent struct {
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
func (r *eventRing) since(seq uint64) (events []seqEvent, missed uint64) {
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
	events = make([]seqEvent, 0, r.seq-first+1)
	for s := first; s <= r.seq; s++ {
		events = append(events, seqEvent{Seq: s, Event: r.buf[s%recentEvents]})
	}
	return events, missed
}

// changed is closed when the next event is added.
func (r *eventRing) changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.notify == nil {
		r.notify = make(chan struct{})
	}
	return r.notify
}

// last is the number of the last event added.
func (r *eventRing) last() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}
