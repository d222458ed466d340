package pool

import "github.com/knitgo/knit/supervisor"

// eventReplay is how many of the transitions before the first call of Events it delivers
// first.
const eventReplay = 64

// remember keeps e among the last transitions for a first call of Events. evMu is held.
func (p *Pool) remember(e supervisor.Event) {
	n := max(min(eventReplay, p.cfg.EventBuffer), 1)
	if len(p.recent) >= n {
		copy(p.recent, p.recent[len(p.recent)-n+1:])
		p.recent = p.recent[:n-1]
	}
	p.recent = append(p.recent, e)
}

// subscribe makes the events channel on the first call of Events, filled with the
// transitions remembered so far; from then on every transition is sent to it.
func (p *Pool) subscribe() <-chan supervisor.Event {
	if p.evWanted.Load() {
		return p.events
	}
	p.evMu.Lock()
	defer p.evMu.Unlock()
	if p.events == nil {
		p.events = make(chan supervisor.Event, max(p.cfg.EventBuffer, len(p.recent)))
		for _, e := range p.recent {
			p.events <- e
		}
		p.recent = nil
		if p.evDone {
			close(p.events)
		}
		p.evWanted.Store(true)
	}
	return p.events
}
