package actors

import (
	"bytes"
	"errors"
	"math"
	"runtime/metrics"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fuzzDecode decodes b with c; on success the value must encode again.
// It returns the re-encoding, or nil if b did not decode.
func fuzzDecode[T any](t *testing.T, c Codec[T], b []byte) []byte {
	t.Helper()
	in := bytes.Clone(b)
	v, err := c.Decode(b)
	if !bytes.Equal(in, b) {
		t.Fatalf("%s: Decode modified its input", c.Name())
	}
	if err != nil {
		return nil
	}
	out, err := c.Append(nil, v)
	if errors.Is(err, ErrOverBudget) && len(b) > 0 {
		// A payload that spends bytes on long-form heads or on fields the encoder omits
		// fits the budget its length gives it, while the value's shorter re-encoding
		// may not: the sender refuses what its receiver would.
		return nil
	}
	if err != nil {
		t.Fatalf("%s: decoded %x to %#v, which does not encode: %v", c.Name(), b, v, err)
	}
	return out
}

func mustCodec[T any](f *testing.F) Codec[T] {
	c, err := CodecFor[T]()
	if err != nil {
		f.Fatal(err)
	}
	return c
}

func seed[T any](f *testing.F, c Codec[T], vs ...T) {
	for _, v := range vs {
		b, err := c.Append(nil, v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

func FuzzDecodeFixed(f *testing.F) {
	i64, f64, pair := mustCodec[int64](f), mustCodec[float64](f), mustCodec[[2]int64](f)
	b, flg, bools := mustCodec[bool](f), mustCodec[flag](f), mustCodec[[4]bool](f)
	v3, c128, d, i16s := mustCodec[vec3](f), mustCodec[complex128](f), mustCodec[dur](f), mustCodec[[3]int16](f)
	seed(f, i64, 0, -1, math.MaxInt64)
	seed(f, f64, math.Inf(-1), math.NaN())
	seed(f, pair, [2]int64{1, -1})
	seed(f, bools, [4]bool{true, false, true, false})
	seed(f, v3, vec3{1, 2, 3})
	seed(f, c128, complex(1, -1))
	f.Add([]byte{})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, in []byte) {
		// Fixed encodings are canonical: what decodes re-encodes to itself.
		check := func(name string, out []byte) {
			if out != nil && !bytes.Equal(out, in) {
				t.Fatalf("%s: %x re-encodes as %x", name, in, out)
			}
		}
		check("int64", fuzzDecode(t, i64, in))
		check("float64", fuzzDecode(t, f64, in))
		check("[2]int64", fuzzDecode(t, pair, in))
		check("bool", fuzzDecode(t, b, in))
		check("flag", fuzzDecode(t, flg, in))
		check("[4]bool", fuzzDecode(t, bools, in))
		check("vec3", fuzzDecode(t, v3, in))
		check("complex128", fuzzDecode(t, c128, in))
		check("dur", fuzzDecode(t, d, in))
		check("[3]int16", fuzzDecode(t, i16s, in))
	})
}

// fuzzRecord has nested slices, maps, pointers and an interface.
type fuzzRecord struct {
	Name   string
	N      int64
	U      uint32
	F      float64
	Blob   []byte
	Tags   []string
	Grid   [][]int16
	Index  map[string][]int
	Nested map[string]map[string]string
	Child  *fuzzRecord
	Kids   []fuzzRecord
	Any    any
	Arr    [3]uint8
	When   time.Time
}

func FuzzDecodeCBOR(f *testing.F) {
	rec, anyc := mustCodec[fuzzRecord](f), mustCodec[any](f)
	seed(f, rec,
		fuzzRecord{},
		fuzzRecord{
			Name: "root", N: -1, U: 7, F: 1.5, Blob: []byte{0, 1}, Tags: []string{"a", ""},
			Grid:   [][]int16{{1, -2}, nil},
			Index:  map[string][]int{"x": {1, 2, 3}},
			Nested: map[string]map[string]string{"m": {"k": "v"}},
			Child:  &fuzzRecord{Name: "child", Any: []any{"x", 1.0}},
			Kids:   []fuzzRecord{{Name: "kid"}},
			Any:    map[any]any{"k": []any{uint64(1), nil}},
			Arr:    [3]uint8{1, 2, 3},
			When:   time.Date(2024, 1, 2, 3, 4, 5, 6, time.UTC),
		})
	seed[any](f, anyc, nil, "s", int64(-5), uint64(5), 2.5, true, []byte("b"),
		[]any{"x", []any{}}, map[any]any{"k": map[any]any{uint64(1): "v"}})
	f.Add([]byte{0xc1, 0x1a, 0x65, 0x53, 0xf1, 0x00}) // tag 1: epoch time
	f.Add([]byte{0xc2, 0x42, 0x01, 0x00})             // tag 2: bignum
	f.Add([]byte{0xd9, 0xd9, 0xf7, 0xf6})             // self-described null
	f.Fuzz(func(t *testing.T, in []byte) {
		fuzzDecode(t, rec, in)
		fuzzDecode(t, anyc, in)
	})
}

func FuzzDecodeProto(f *testing.F) {
	sc, wc := mustCodec[*structpb.Struct](f), mustCodec[*wrapperspb.StringValue](f)
	st, err := structpb.NewStruct(map[string]any{
		"a": 1.0, "b": "two", "c": []any{true, nil, map[string]any{"d": "e"}},
	})
	if err != nil {
		f.Fatal(err)
	}
	seed(f, sc, st, &structpb.Struct{})
	seed(f, wc, wrapperspb.String("hello"))
	f.Fuzz(func(t *testing.T, in []byte) {
		if out := fuzzDecode(t, sc, in); out != nil {
			// Field order may change, but the message must survive.
			a, _ := sc.Decode(in)
			b, err := sc.Decode(out)
			if err != nil || !proto.Equal(a, b) {
				t.Fatalf("Struct re-encoding does not decode to the same message: %v", err)
			}
		}
		fuzzDecode(t, wc, in)
	})
}

func FuzzDecodeWireError(f *testing.F) {
	f.Add(EncodeWireError(nil, "", ""))
	f.Add(EncodeWireError(nil, "E_TIMEOUT", "deadline exceeded"))
	f.Add(EncodeWireError(nil, "", "message only"))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(EncodeWireStack(nil, "", "boom", []byte("goroutine 1 [running]:\n")))
	f.Fuzz(func(t *testing.T, in []byte) {
		w, err := DecodeWireError(in)
		if err != nil {
			return
		}
		if out := EncodeWireStack(nil, w.Code, w.Message, []byte(w.Stack)); !bytes.Equal(out, in) {
			t.Fatalf("%x decodes to %+v, which re-encodes as %x", in, w, out)
		}
	})
}

// budgetBig is 4 KiB of memory that encodes as an empty map.
type budgetBig struct {
	A [4096]byte `cbor:"-"`
	N int        `cbor:",omitempty"`
}

// FuzzDecodeBudget decodes arbitrary bytes into types that amplify (large slice elements,
// pointers to large values, maps, interfaces, recursion) and checks that no decode, however
// it ends, allocates more than the budget for its input length.
func FuzzDecodeBudget(f *testing.F) {
	arrays, ptrs := mustCodec[[][8192]byte](f), mustCodec[[]*budgetBig](f)
	maps, anys := mustCodec[map[string][]int64](f), mustCodec[any](f)
	nodes, recs := mustCodec[*node](f), mustCodec[[]fuzzRecord](f)
	nested := mustCodec[map[int64]map[string][]*budgetBig](f)
	seed(f, arrays, nil, make([][8192]byte, 2))
	seed(f, ptrs, []*budgetBig{{N: 1}, nil})
	seed(f, maps, map[string][]int64{"a": {1, 2}, "b": nil})
	seed[any](f, anys, []any{map[any]any{"k": []any{}}, "s", 1.5})
	seed(f, nodes, chain(3))
	seed(f, recs, []fuzzRecord{{Name: "r", Kids: []fuzzRecord{{}}}})
	seed(f, nested, map[int64]map[string][]*budgetBig{1: {"x": {{N: 2}}}})
	// Over the budget: 300 × 8 KiB, and 512 × 4 KiB pointees, from a few hundred bytes.
	f.Add(forged(300))
	f.Add(append([]byte{0x99, 0x02, 0x00}, bytes.Repeat([]byte{0xa0}, 0x200)...))
	f.Add(append([]byte{0x99, 0x02, 0x00}, bytes.Repeat([]byte{0xf6}, 0x200)...))
	// Fixed costs that do not grow with the payload, repeated in a []fuzzRecord: a key no
	// field has, a misfit, a duplicate field, a time with an odd zone, empty slices.
	for _, elem := range [][]byte{
		{0xa1, 0x61, 'z', 0x01},
		{0xa2, 0x61, 'z', 0x01, 0x61, 'y', 0x01},
		{0xa1, 0x61, 'N', 0xa0},
		{0xa2, 0x61, 'n', 0x01, 0x61, 'N', 0x02},
		append([]byte{0xa1, 0x64, 'W', 'h', 'e', 'n', 0x78, 25}, "2006-01-02T15:04:05+01:01"...),
		{0xa1, 0x64, 'G', 'r', 'i', 'd', 0x82, 0x80, 0x80},
		{0xa1, 0x64, 'T', 'a', 'g', 's', 0x81, 0x40},
	} {
		f.Add(append([]byte{0x99, 0x01, 0x00}, bytes.Repeat(elem, 0x100)...))
	}
	// Warm fxamacker/cbor's type caches, which allocate once per type.
	for _, b := range [][]byte{{0x80}, {0xa0}, {0x81, 0xa0}} {
		_, _ = arrays.Decode(b)
		_, _ = ptrs.Decode(b)
		_, _ = maps.Decode(b)
		_, _ = anys.Decode(b)
		_, _ = nodes.Decode(b)
		_, _ = recs.Decode(b)
		_, _ = nested.Decode(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		// The slack covers the decoder's own bookkeeping, the value's top-level slot and
		// the allocator's accounting by span.
		limit := uint64(decodeBudget(len(in))) + 64<<10
		for name, decode := range map[string]func(){
			"[][8192]byte":       func() { _, _ = arrays.Decode(in) },
			"[]*budgetBig":       func() { _, _ = ptrs.Decode(in) },
			"map[string][]int64": func() { _, _ = maps.Decode(in) },
			"any":                func() { _, _ = anys.Decode(in) },
			"*node":              func() { _, _ = nodes.Decode(in) },
			"[]fuzzRecord":       func() { _, _ = recs.Decode(in) },
			"nested":             func() { _, _ = nested.Decode(in) },
		} {
			// The count moves by whole spans, and now and then by a few hundred KB more
			// (3000 decodes of one 8 KB payload: 1.26-1.39 MB, once 1.54 MB): an overrun
			// must show in three tries, as a real one does.
			got := heapAllocated(decode)
			for try := 0; try < 2 && got > limit; try++ {
				got = min(got, heapAllocated(decode))
			}
			if got > limit {
				t.Fatalf("%s: decoding %d bytes allocated %d bytes, budget %d", name, len(in), got, limit)
			}
		}
	})
}

// heapAllocated runs f and returns the bytes allocated meanwhile, as the runtime counts them
// without stopping the world (small objects by span, so give or take a few spans): precise
// enough to catch a budget overrun, cheap enough to fuzz with.
func heapAllocated(f func()) uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	before := s[0].Value.Uint64()
	f()
	metrics.Read(s)
	return s[0].Value.Uint64() - before
}
