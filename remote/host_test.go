package remote

import (
	"fmt"
	"testing"
)

// place spreads lanes over their home nodes, and a lost node's lanes over the live nodes
// with the fewest, counting lanes placed together.
func TestPlace(t *testing.T) {
	n := &Nodes{current: make([]*incarnation, 6)}
	for i := range 3 {
		n.links = append(n.links, &link{n: n, idx: i, addr: fmt.Sprint("node", i), changed: make(chan struct{})})
	}
	put := func(idx int) int {
		k := n.place(idx)
		n.current[idx] = &incarnation{k: k, idx: idx}
		return k.idx
	}
	for idx := range 6 { // never connected: each lane at home
		if got := put(idx); got != idx%3 {
			t.Errorf("lane %d on node %d, want its home %d", idx, got, idx%3)
		}
	}
	n.links[0].st, n.links[1].st, n.links[2].st = linkUp, linkDown, linkUp
	// Lanes 1 and 4 lose node 1: one goes to each survivor (node 2 first: the one after
	// lane 1's home), never to the lost node.
	if a, b := put(1), put(4); a != 2 || b != 0 {
		t.Errorf("lanes 1 and 4 on nodes %d and %d, want 2 and 0", a, b)
	}
	n.links[0].st, n.links[2].st = linkDown, linkDown
	if got := put(3); got != 0 { // nothing up: home, whose start fails with the reason
		t.Errorf("with every node down, lane 3 on node %d, want its home 0", got)
	}
	n.links[1].st = linkUp
	if got := put(4); got != 1 {
		t.Errorf("lane 4 on node %d, want its home 1 (back)", got)
	}
}
