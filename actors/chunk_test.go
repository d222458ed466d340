package actors

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

var chunkDouble = Define("test.chunk.double", func(_ context.Context, x int64) (int64, error) {
	switch {
	case x < 0:
		return 0, fmt.Errorf("negative %d", x)
	case x == 666:
		panic("the devil's number")
	}
	return 2 * x, nil
}, Options{})

func chunkTwin(t testing.TB) *Task[[]int64, []byte] {
	t.Helper()
	tw, ok := chunkDouble.Twin().(*Task[[]int64, []byte])
	if !ok {
		t.Fatalf("twin is %T", chunkDouble.Twin())
	}
	return tw
}

// A twin runs each element of its chunk and answers with every element's outcome, in order;
// the host's decoder reads them back.
func TestTwinRunsEachElement(t *testing.T) {
	tw := chunkTwin(t)
	if got, want := tw.Name(), chunkDouble.Name()+TwinSuffix; got != want {
		t.Errorf("twin name %q, want %q", got, want)
	}
	if d, ok := Lookup(tw.Name()); !ok || d != Def(tw) {
		t.Errorf("Lookup(%q) = %v, %v", tw.Name(), d, ok)
	}
	in, err := tw.InCodec.Append(nil, []int64{1, -2, 666, 4})
	if err != nil {
		t.Fatal(err)
	}
	if c, c1 := Calls(tw, in), Calls(chunkDouble, in); c != 4 || c1 != 1 || Calls(tw, in[:3]) != 1 {
		t.Errorf("Calls: twin %d, task %d, a short payload %d; want 4, 1, 1", c, c1, Calls(tw, in[:3]))
	}
	var marks []int
	out, o, ok := tw.RunChunk(context.Background(), in, nil, 1<<20, false, func(n int) { marks = append(marks, n) })
	if !ok || o != OK {
		t.Fatalf("RunChunk: %v, %v", o, ok)
	}
	if fmt.Sprint(marks) != "[1 2 3 4]" {
		t.Errorf("marks %v", marks)
	}
	res, err := tw.OutCdc.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	n, entries := ChunkResults(res)
	if n != 4 {
		t.Fatalf("%d entries", n)
	}
	var got []string
	for e, err := range entries {
		if err != nil {
			t.Fatal(err)
		}
		switch e.Outcome {
		case OK:
			v, err := chunkDouble.OutCdc.Decode(e.Payload())
			got = append(got, fmt.Sprint(v, err))
		default:
			we, err := DecodeWireError(e.Payload())
			got = append(got, fmt.Sprint(e.Outcome, " ", we.Message, err))
		}
	}
	if want := "[2 <nil> failed negative -2<nil> panicked the devil's number<nil> 8 <nil>]"; fmt.Sprint(got) != want {
		t.Errorf("entries %v, want %v", got, want)
	}
	// A lane whose panics crash it ends the chunk with the panic, as a call's.
	if out, o, _ := tw.RunChunk(context.Background(), in, nil, 1<<20, true, func(int) {}); o != Panicked {
		t.Errorf("with crash: %v", o)
	} else if we, err := DecodeWireError(out); err != nil || we.Message != "the devil's number" {
		t.Errorf("with crash: %+v, %v", we, err)
	}
	// An ended context starts no element: each is Stale.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, _, _ = tw.RunChunk(ctx, in, nil, 1<<20, false, func(int) { t.Error("an element started") })
	_, entries = ChunkResults(out)
	for e := range entries {
		if e.Outcome != Stale {
			t.Errorf("outcome %v after the context ended", e.Outcome)
		}
	}
	if _, _, ok := chunkDouble.RunChunk(context.Background(), in, nil, 1<<20, false, func(int) {}); ok {
		t.Error("a task that is no twin ran a chunk")
	}
}

// The decoders of chunks refuse what breaks the framing, with ErrCorrupt.
func TestChunkFramingErrors(t *testing.T) {
	tw := chunkTwin(t)
	good, _ := tw.InCodec.Append(nil, []int64{7})
	for _, b := range [][]byte{
		nil,
		{1, 0, 0},
		binary.LittleEndian.AppendUint32(nil, MaxChunk+1),
		good[:len(good)-1],
		append(append([]byte(nil), good...), 0),
	} {
		if _, err := tw.InCodec.Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("input %x: %v", b, err)
		}
		if _, err := tw.OutCdc.Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("result %x: %v", b, err)
		}
		out, o, _ := tw.RunChunk(context.Background(), b, nil, 1<<20, false, func(int) {})
		if we, err := DecodeWireError(out); o != BadInput || err != nil || we.Code != CodeUnsupportedType {
			t.Errorf("RunChunk(%x): %v %+v %v", b, o, we, err)
		}
	}
}

// FuzzChunkResult feeds a host hostile chunk results: the decoder never panics, and a result
// it accepts yields exactly its count of entries.
func FuzzChunkResult(f *testing.F) {
	tw := chunkTwin(f)
	in, _ := tw.InCodec.Append(nil, []int64{1, -2, 666})
	good, _, _ := tw.RunChunk(context.Background(), in, nil, 1<<20, false, func(int) {})
	f.Add(good)
	f.Add([]byte{1, 0, 0, 0, 9, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		res, err := chunkOut{}.Decode(b)
		if err != nil {
			return
		}
		if !bytes.Equal(res, b) {
			t.Fatalf("decoded %x to %x", b, res)
		}
		n, entries := ChunkResults(res)
		seen := 0
		for _, err := range entries {
			if err != nil {
				t.Fatalf("accepted %x, then: %v", b, err)
			}
			seen++
		}
		if seen != n {
			t.Fatalf("%d entries of %d", seen, n)
		}
	})
}

// FuzzRunChunk feeds a lane hostile chunks: it never panics, and answers with a result the
// host's decoder accepts, or a BadInput report.
func FuzzRunChunk(f *testing.F) {
	tw := chunkTwin(f)
	in, _ := tw.InCodec.Append(nil, []int64{1, -2, 3})
	f.Add(in)
	f.Add([]byte{2, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		out, o, _ := tw.RunChunk(context.Background(), b, nil, 1<<10, false, func(int) {})
		switch o {
		case OK:
			if _, err := tw.OutCdc.Decode(out); err != nil {
				t.Fatalf("chunk %x answered %x, which does not decode: %v", b, out, err)
			}
		case BadInput:
			if _, err := DecodeWireError(out); err != nil {
				t.Fatalf("chunk %x: report %x: %v", b, out, err)
			}
		default:
			t.Fatalf("chunk %x: outcome %v", b, o)
		}
	})
}
