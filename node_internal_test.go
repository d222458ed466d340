package knit

import (
	"testing"

	"github.com/knitgo/knit/actors"
	"github.com/knitgo/knit/fastpath"
	"github.com/knitgo/knit/remote"
)

// A node reports what its lane's chunk word says of a call, cut to what a chunk can hold:
// a lane process that writes a larger count must not make the host refuse the node's whole
// end report.
func TestChunkBegan(t *testing.T) {
	for _, c := range []struct {
		word, seq uint64
		want      int
	}{
		{fastpath.ChunkWord(7, 3), 7, 3},
		{fastpath.ChunkWord(7, 3), 8, -1}, // another call's word
		{0, 7, -1},
		{fastpath.ChunkWord(7, 1<<13-1), 7, actors.MaxChunk}, // all the bits a lane can set
	} {
		if got := chunkBegan(c.word, c.seq); got != c.want {
			t.Errorf("chunkBegan(%#x, %d) = %d, want %d", c.word, c.seq, got, c.want)
		}
		frame := remote.AppendEnded(remote.AppendHeader(nil, remote.KindEnded, remote.Session{}, 0, 0),
			&remote.Ended{Busy: true, Began: chunkBegan(c.word, c.seq)})
		f, err := remote.Parse(frame)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Ended(); err != nil {
			t.Errorf("the host refuses the end report of %#x: %v", c.word, err)
		}
	}
}
