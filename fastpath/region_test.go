package fastpath

import (
	"encoding/binary"
	"strings"
	"testing"
)

// TestFatalMessageLeavesControlBlock: the longest fatal message a lane can leave reads back
// whole and disturbs no other word of the control block (protocol version 1 put the area
// over the boot word, the fatal length and the part table).
func TestFatalMessageLeavesControlBlock(t *testing.T) {
	r := newTestRegion(t, Layout{})
	before := append([]byte(nil), r.Bytes()[:offFatal]...)
	msg := strings.Repeat("fingerprint mismatch; ", FatalBytes/22+1)[:FatalBytes]
	r.SetFatal(msg)
	if got := r.Fatal(); got != msg {
		t.Fatalf("fatal message read back as %q", got)
	}
	if r.Boot().Load() != BootFailed {
		t.Fatalf("boot word %d, want BootFailed", r.Boot().Load())
	}
	after := r.Bytes()[:offFatal]
	for i := range before {
		if i >= offBoot && i < offFatalLen+4 {
			continue // the words SetFatal sets
		}
		if before[i] != after[i] {
			t.Fatalf("byte %d of the control block changed: %#x -> %#x", i, before[i], after[i])
		}
	}
	if n := binary.LittleEndian.Uint32(after[offFatalLen:]); n != FatalBytes {
		t.Fatalf("fatal length %d", n)
	}
	if _, err := OpenRegion(r.Bytes()); err != nil {
		t.Fatalf("region no longer opens after a fatal message: %v", err)
	}
}
