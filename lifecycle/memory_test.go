package lifecycle

import (
	"testing"

	"github.com/knitgo/knit/fastpath"
)

// TestMemory: a process lane's memory is a region for its lane and incarnation, with the
// memfd and the eventfd to hand the lane, in that order.
func TestMemory(t *testing.T) {
	layout := fastpath.Layout{Inline: 64, Arena: 4096, AbortBits: fastpath.DefaultAbortBits}
	m, err := NewMemory(layout, 3, 2, 1)
	if err != nil {
		t.Skipf("no memfd here: %v", err)
	}
	defer m.Close()
	if m.Region.Lane() != 3 || m.Region.Incarnation() != 2 {
		t.Fatalf("region for lane %d incarnation %d", m.Region.Lane(), m.Region.Incarnation())
	}
	files := m.Files()
	if len(files) != 2 || files[0] == nil || files[1] == nil || files[0].Fd() == files[1].Fd() {
		t.Fatalf("files %v", files)
	}
	if m.DoneBell() == nil {
		t.Fatal("no doorbell")
	}
	if _, err := NewMemory(fastpath.Layout{Inline: -1}, 0, 0, 0); err == nil {
		t.Fatal("a region with a bad layout")
	}
}
