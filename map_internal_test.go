package knit

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/knitgo/knit/actors"
)

var (
	chunkProbe           = Define("test.internal.chunk", func(_ context.Context, x int) (int, error) { return x, nil })
	chunkProbeIdempotent = Define("test.internal.chunk.idempotent", func(_ context.Context, x int) (int, error) { return x, nil }, Idempotent())
)

// chunkDone turns a chunk's answer into its elements' outcomes, and never runs again by
// itself an element that may have run, unless the task is Idempotent.
func TestChunkDone(t *testing.T) {
	entry := func(b []byte, o actors.Outcome, p []byte) []byte {
		b = append(b, byte(o))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p)))
		return append(b, p...)
	}
	seven, _ := chunkProbe.def.OutCdc.Append(nil, 7)
	answer := binary.LittleEndian.AppendUint32(nil, 4)
	answer = entry(answer, actors.OK, seven)
	answer = entry(answer, actors.Failed, actors.EncodeWireError(nil, "", "no"))
	answer = entry(answer, actors.Stale, nil)
	answer = entry(answer, actors.Panicked, []byte{1}) // not a WireError
	crashed := &Error{Code: CodeWorkerCrashed, Lane: 1, Task: "twin", Started: true}
	for _, c := range []struct {
		name  string
		task  *Task[int, int]
		raw   []byte
		began int
		err   error
		want  string // failed elements with their codes, then those to run alone
	}{
		{"answer", chunkProbe, answer, -1, nil, "[1:TASK_ERROR 3:WORKER_CRASHED] alone [2] out 7"},
		{"wrong count", chunkProbe, entry(binary.LittleEndian.AppendUint32(nil, 1), actors.OK, seven), -1, nil,
			"[0:WORKER_CRASHED 1:WORKER_CRASHED 2:WORKER_CRASHED 3:WORKER_CRASHED] alone [] out 0"},
		{"truncated", chunkProbe, answer[:len(answer)-1], -1, nil, "[1:TASK_ERROR 3:WORKER_CRASHED] alone [2] out 7"},
		{"lane died, 2 started", chunkProbe, nil, 2, crashed, "[0:WORKER_CRASHED 1:WORKER_CRASHED] alone [2 3] out 0"},
		{"lane died, started unknown", chunkProbe, nil, -1, crashed, "[0:WORKER_CRASHED 1:WORKER_CRASHED 2:WORKER_CRASHED 3:WORKER_CRASHED] alone [] out 0"},
		{"lane died, Idempotent", chunkProbeIdempotent, nil, 2, crashed, "[] alone [0 1 2 3] out 0"},
		{"broke the protocol", chunkProbe, nil, -1, brokeProtocol(1, chunkProbe.def, fmt.Errorf("garbage")),
			"[0:WORKER_CRASHED 1:WORKER_CRASHED 2:WORKER_CRASHED 3:WORKER_CRASHED] alone [] out 0"},
	} {
		out := make([]int, 4)
		f := failures{task: c.task.Name()}
		alone := []int{}
		c.task.chunkDone(0, 4, c.raw, chunkEnd{lane: 1, began: c.began}, c.err, out, &f, &alone)
		var failed []string
		for _, e := range f.list {
			failed = append(failed, fmt.Sprintf("%d:%s", e.Index, e.Err.Code))
			if e.Err.Task != c.task.Name() || e.Err.Lane != 1 {
				t.Errorf("%s: element %d names task %q, lane %d", c.name, e.Index, e.Err.Task, e.Err.Lane)
			}
		}
		if got := fmt.Sprintf("%v alone %v out %d", failed, alone, out[0]); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
