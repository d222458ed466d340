package actors

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/fxamacker/cbor/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Test types.

type (
	dur      int64
	vec3     [3]float64
	id       string
	blob     []byte
	myByte   uint8
	flag     bool
	durPair  [2]dur
	bigArray [9]int64 // 72 bytes: over the fixed limit, so CBOR
)

// point has a value MarshalBinary and a pointer UnmarshalBinary.
type point struct{ X, Y int32 }

func (p point) MarshalBinary() ([]byte, error) {
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, uint32(p.X)), uint32(p.Y)), nil
}

func (p *point) UnmarshalBinary(b []byte) error {
	if len(b) != 8 {
		return fmt.Errorf("point: %d bytes", len(b))
	}
	p.X, p.Y = int32(binary.LittleEndian.Uint32(b)), int32(binary.LittleEndian.Uint32(b[4:]))
	return nil
}

// label has both methods on the pointer, and AppendBinary too.
type label struct{ S string }

func (l *label) MarshalBinary() ([]byte, error) { return []byte(l.S), nil }
func (l *label) AppendBinary(b []byte) ([]byte, error) {
	return append(b, l.S...), nil
}

func (l *label) UnmarshalBinary(b []byte) error {
	if bytes.IndexByte(b, 0) >= 0 {
		return errors.New("label: NUL byte")
	}
	l.S = string(b)
	return nil
}

// panicky panics on malformed input, as careless user code might.
type panicky struct{ N byte }

func (p panicky) MarshalBinary() ([]byte, error) { return []byte{p.N}, nil }
func (p *panicky) UnmarshalBinary(b []byte) error {
	p.N = b[0] // index out of range on empty input
	return nil
}

type inner struct {
	Name  string
	Score float64
	Tags  []string
}

type record struct {
	ID      int64
	Label   string
	Data    []byte
	Inner   inner
	Inners  []inner
	Ptr     *inner
	Nested  [][]int
	Counts  map[string]int
	ByKey   map[int64][]string
	Any     any
	When    time.Time
	Big     bigArray
	Skipped func() `cbor:"-"`
	hidden  chan int
}

type node struct {
	Val  int
	Next *node
}

type withFunc struct {
	Name string
	F    func()
}

type withHiddenFunc struct {
	Name string
	f    func()
}

type withErr struct{ Err error }

type withComplex struct{ C complex128 }

type recursiveBad struct {
	Kids []recursiveBad
	C    chan struct{}
}

// codecCase is one round-trip check, erased to a closure over its type.
type codecCase struct {
	name string
	run  func(t *testing.T)
}

// rt builds a round-trip case: the codec's name, the fixed size (-1 for
// none), and equality for the type.
func rt[T any](name string, v T, wantCodec string, wantSize int) codecCase {
	return rtEq(name, v, wantCodec, wantSize, func(a, b T) bool { return reflect.DeepEqual(a, b) })
}

func rtEq[T any](name string, v T, wantCodec string, wantSize int, eq func(a, b T) bool) codecCase {
	return codecCase{name, func(t *testing.T) {
		t.Helper()
		c, err := CodecFor[T]()
		if err != nil {
			t.Fatalf("CodecFor[%T]: %v", v, err)
		}
		if got := c.Name(); got != wantCodec {
			t.Errorf("Name() = %q, want %q", got, wantCodec)
		}
		n, ok := FixedSize(c)
		if wantSize < 0 && ok {
			t.Errorf("FixedSize = %d, true; want not fixed", n)
		}
		if wantSize >= 0 && (!ok || n != wantSize) {
			t.Errorf("FixedSize = %d, %v; want %d, true", n, ok, wantSize)
		}
		const prefix = "prefix"
		out, err := c.Append([]byte(prefix), v)
		if err != nil {
			t.Fatalf("Append: %v", err)
		}
		if !bytes.HasPrefix(out, []byte(prefix)) {
			t.Fatalf("Append clobbered dst: %q", out[:min(len(out), len(prefix))])
		}
		enc := out[len(prefix):]
		if ok && len(enc) != n {
			t.Errorf("encoded %d bytes, FixedSize says %d", len(enc), n)
		}
		got, err := c.Decode(enc)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if !eq(got, v) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, v)
		}
		// Decode must not retain b: scribble over it and look again.
		for i := range enc {
			enc[i] ^= 0xA5
		}
		if !eq(got, v) {
			t.Fatalf("decoded value changed when the input was overwritten: %#v", got)
		}
	}}
}

func sized(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

func TestCodecRoundTrip(t *testing.T) {
	when := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("X", 3600))
	sameTime := func(a, b time.Time) bool { return a.Equal(b) }
	sameBits64 := func(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }
	protoEq := func(a, b proto.Message) bool { return proto.Equal(a, b) }
	st, err := structpb.NewStruct(map[string]any{
		"name": "knit", "n": 3.5, "ok": true, "list": []any{1.0, "two", nil},
		"nested": map[string]any{"deep": map[string]any{"x": -1.0}},
	})
	if err != nil {
		t.Fatal(err)
	}

	cases := []codecCase{
		// 1. Fixed size.
		rt("bool/true", true, "bool", 1),
		rt("bool/zero", false, "bool", 1),
		rt("int8/min", int8(math.MinInt8), "int8", 1),
		rt("int8/max", int8(math.MaxInt8), "int8", 1),
		rt("int16/min", int16(math.MinInt16), "int16", 2),
		rt("int32/min", int32(math.MinInt32), "int32", 4),
		rt("int32/zero", int32(0), "int32", 4),
		rt("int64/min", int64(math.MinInt64), "int64", 8),
		rt("int64/max", int64(math.MaxInt64), "int64", 8),
		rt("int64/zero", int64(0), "int64", 8),
		rt("int/neg", -42, "int", int(unsafe.Sizeof(0))),
		rt("uint8/max", uint8(math.MaxUint8), "uint8", 1),
		rt("uint16/max", uint16(math.MaxUint16), "uint16", 2),
		rt("uint32/max", uint32(math.MaxUint32), "uint32", 4),
		rt("uint64/max", uint64(math.MaxUint64), "uint64", 8),
		rt("uint/max", uint(math.MaxUint), "uint", int(unsafe.Sizeof(uint(0)))),
		rt("float32", float32(-1.5), "float32", 4),
		rt("float32/inf", float32(math.Inf(1)), "float32", 4),
		rt("float64", math.Pi, "float64", 8),
		rt("float64/zero", 0.0, "float64", 8),
		rt("float64/negzero", math.Copysign(0, -1), "float64", 8),
		rtEq("float64/nan", math.Float64frombits(0x7ff8_dead_beef_0001), "float64", 8, sameBits64),
		rt("complex64", complex64(complex(1.5, -2)), "complex64", 8),
		rt("complex128", complex(math.E, -math.Pi), "complex128", 16),
		rt("[2]int64", [2]int64{math.MinInt64, 7}, "fixed[2]int64", 16),
		rt("[2]int64/zero", [2]int64{}, "fixed[2]int64", 16),
		rt("[3]float64", [3]float64{1, -2, 3.25}, "fixed[3]float64", 24),
		rt("[4]bool", [4]bool{true, false, true, true}, "fixed[4]bool", 4),
		rt("[2][3]int32", [2][3]int32{{1, 2, 3}, {-4, -5, math.MaxInt32}}, "fixed[2][3]int32", 24),
		rt("[8]int64/64 bytes", [8]int64{1, 2, 3, 4, 5, 6, 7, -8}, "fixed[8]int64", 64),
		rt("[4]complex128", [4]complex128{1, 2i, 3 + 3i, -4}, "fixed[4]complex128", 64),
		rt("[16]byte", [16]byte{0: 1, 15: 0xff}, "fixed[16]uint8", 16),
		rt("[3]uint16", [3]uint16{1, 0xfffe, 0x1234}, "fixed[3]uint16", 6),
		rt("[0]int64", [0]int64{}, "fixed[0]int64", 0),
		rt("named/dur", dur(-5), "int64", 8),
		rt("named/time.Duration", 90*time.Second, "int64", 8),
		rt("named/flag", flag(true), "bool", 1),
		rt("named/myByte", myByte(200), "uint8", 1),
		rt("named/vec3", vec3{1, 2, 3}, "fixed[3]float64", 24),
		rt("named/[2]dur", durPair{3, -3}, "fixed[2]int64", 16),

		// 2. Raw bytes.
		rt("string/empty", "", "string", -1),
		rt("string/short", "héllo, wörld", "string", -1),
		rt("string/512", string(sized(512)), "string", -1),
		rt("string/513", string(sized(513)), "string", -1),
		rt("string/1MiB", string(sized(1<<20)), "string", -1),
		rt("string/2MiB", string(sized(2<<20)), "string", -1),
		rt("string/named", id("order-17"), "string", -1),
		rt("bytes/nil", []byte(nil), "bytes", -1),
		rt("bytes/512", sized(512), "bytes", -1),
		rt("bytes/513", sized(513), "bytes", -1),
		rt("bytes/1MiB", sized(1<<20), "bytes", -1),
		rt("bytes/2MiB", sized(2<<20), "bytes", -1),
		rt("bytes/named", blob("\x00\x01raw"), "bytes", -1),
		rt("bytes/named elem", []myByte{1, 2, 255}, "bytes", -1),

		// 3. BinaryMarshaler.
		rt("binary/value", point{X: -1, Y: math.MaxInt32}, "binary", -1),
		rt("binary/zero", point{}, "binary", -1),
		rt("binary/pointer", &label{S: "pointer receiver"}, "binary", -1),
		rtEq("binary/time.Time", when, "binary", -1, sameTime),

		// 4. Proto.
		rtEq("proto/StringValue", wrapperspb.String("hello"), "proto", -1,
			func(a, b *wrapperspb.StringValue) bool { return protoEq(a, b) }),
		rtEq("proto/StringValue empty", &wrapperspb.StringValue{}, "proto", -1,
			func(a, b *wrapperspb.StringValue) bool { return protoEq(a, b) }),
		rtEq("proto/Struct", st, "proto", -1,
			func(a, b *structpb.Struct) bool { return protoEq(a, b) }),
		rtEq("proto/Duration", durationpb.New(3*time.Second+5), "proto", -1,
			func(a, b *durationpb.Duration) bool { return protoEq(a, b) }),

		// 5. CBOR.
		rtEq("cbor/struct", record{
			ID: 1, Label: "l", Data: []byte{0, 1, 2}, Inner: inner{"in", 0.5, []string{"a"}},
			Inners: []inner{{Name: "x"}, {Tags: []string{}}}, Ptr: &inner{Name: "p"},
			Nested: [][]int{{1, 2}, nil, {}}, Counts: map[string]int{"a": 1, "b": -2},
			ByKey: map[int64][]string{-1: {"neg"}, 1 << 40: nil}, Any: "str", When: when,
			Big: bigArray{1, 2, 3, 4, 5, 6, 7, 8, 9},
		}, "cbor", -1, func(a, b record) bool {
			ok := a.When.Equal(b.When)
			a.When, b.When = time.Time{}, time.Time{}
			return ok && reflect.DeepEqual(a, b)
		}),
		rt("cbor/struct zero", record{}, "cbor", -1),
		rt("cbor/hidden func field", withHiddenFunc{Name: "n"}, "cbor", -1),
		rt("cbor/recursive type", &node{1, &node{2, &node{3, nil}}}, "cbor", -1),
		rt("cbor/map", map[string]int{"one": 1, "two": 2, "": 0}, "cbor", -1),
		rt("cbor/map nil", map[string]int(nil), "cbor", -1),
		rt("cbor/map of slices", map[int][]string{1: {"a", "b"}, 2: {}}, "cbor", -1),
		rt("cbor/slice", []string{"a", "", "c"}, "cbor", -1),
		rt("cbor/slice of fixed", []int64{1, -1, math.MaxInt64}, "cbor", -1),
		rt("cbor/pointer", new(int64(42)), "cbor", -1),
		rt("cbor/pointer nil", (*int64)(nil), "cbor", -1),
		rt("cbor/pointer to struct", &inner{Name: "n", Score: 2}, "cbor", -1),
		rt("cbor/[9]int64", bigArray{9, 8, 7, 6, 5, 4, 3, 2, 1}, "cbor", -1),
		rt("cbor/[65]byte", [65]byte{64: 1}, "cbor", -1),
		rt("cbor/empty struct", struct{}{}, "cbor", -1),
		rt("cbor/any nil", any(nil), "cbor", -1),
		rt("cbor/any string", any("s"), "cbor", -1),
		rt("cbor/any uint", any(uint64(7)), "cbor", -1),
		rt("cbor/any neg", any(int64(-7)), "cbor", -1),
		rt("cbor/any float", any(2.5), "cbor", -1),
		rt("cbor/any bytes", any([]byte{1, 2}), "cbor", -1),
		rt("cbor/any slice", any([]any{uint64(1), "x", nil, true}), "cbor", -1),
		rt("cbor/any map", any(map[any]any{"k": []any{uint64(1)}, uint64(2): "v"}), "cbor", -1),
		rt("cbor/[]any", []any{"x", uint64(1), map[any]any{"y": false}}, "cbor", -1),
	}
	for _, c := range cases {
		t.Run(c.name, c.run)
	}
}

func TestCodecBinaryNilPointer(t *testing.T) {
	c, err := CodecFor[*label]()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Append([]byte("x"), nil)
	if err == nil || !strings.Contains(err.Error(), "*actors.label") {
		t.Fatalf("Append(nil) = %q, %v; want an error naming *actors.label", out, err)
	}
	if string(out) != "x" {
		t.Fatalf("Append(nil) changed dst to %q", out)
	}
}

func TestCodecProtoNil(t *testing.T) {
	c, err := CodecFor[*wrapperspb.StringValue]()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Append(nil, nil)
	if err != nil || len(out) != 0 {
		t.Fatalf("Append(nil) = %x, %v; want empty", out, err)
	}
	got, err := c.Decode(out)
	if err != nil || got == nil || got.GetValue() != "" {
		t.Fatalf("Decode(empty) = %v, %v; want an empty message", got, err)
	}
}

// TestCodecLayoutPortable checks the element-wise path that big-endian hosts
// use against the memory-copy path used here.
func TestCodecLayoutPortable(t *testing.T) {
	check := func(t *testing.T, v any, native, portable func() ([]byte, any, error)) {
		a, _, err := native()
		if err != nil {
			t.Fatal(err)
		}
		b, got, err := portable()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("portable encoding %x, native %x", b, a)
		}
		if !reflect.DeepEqual(got, v) {
			t.Fatalf("portable decode %v, want %v", got, v)
		}
	}
	t.Run("[3]uint16", func(t *testing.T) {
		v := [3]uint16{1, 0xfffe, 0x1234}
		check(t, v, layoutPair(v, true), layoutPair(v, false))
	})
	t.Run("[2]complex64", func(t *testing.T) {
		v := [2]complex64{1 + 2i, -3.5i}
		check(t, v, layoutPair(v, true), layoutPair(v, false))
	})
	t.Run("dur", func(t *testing.T) {
		v := dur(-123456789)
		check(t, v, layoutPair(v, true), layoutPair(v, false))
	})
}

func layoutPair[T any](v T, native bool) func() ([]byte, any, error) {
	return func() ([]byte, any, error) {
		c, ok := newLayoutCodec[T](reflect.TypeFor[T]())
		if !ok {
			return nil, nil, fmt.Errorf("no layout codec for %T", v)
		}
		lc := c.(layoutCodec[T])
		lc.native = native
		b, err := lc.Append(nil, v)
		if err != nil {
			return nil, nil, err
		}
		got, err := lc.Decode(b)
		return b, got, err
	}
}

func TestCodecWireFormat(t *testing.T) {
	// The fixed encodings are little-endian, whatever the host.
	c, _ := CodecFor[[2]int64]()
	b, _ := c.Append(nil, [2]int64{1, -2})
	want := []byte{1, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if !bytes.Equal(b, want) {
		t.Errorf("[2]int64 encoding %x, want %x", b, want)
	}
	v, _ := CodecFor[vec3]()
	b, _ = v.Append(nil, vec3{1, 0, 0})
	if !bytes.Equal(b[:8], binary.LittleEndian.AppendUint64(nil, math.Float64bits(1))) {
		t.Errorf("vec3 encoding %x is not little-endian", b)
	}
}

func TestCodecForRejects(t *testing.T) {
	cases := []struct {
		name  string
		get   func() error
		names string // the type the message must name
	}{
		{"chan", errOf[chan int], "chan int"},
		{"func", errOf[func(int) error], "func(int) error"},
		{"unsafe.Pointer", errOf[unsafe.Pointer], "unsafe.Pointer"},
		{"uintptr", errOf[uintptr], "uintptr"},
		{"[2]uintptr", errOf[[2]uintptr], "uintptr"},
		{"struct with func field", errOf[withFunc], "actors.withFunc"},
		{"map[string]chan int", errOf[map[string]chan int], "map[string]chan int"},
		{"pointer to chan", errOf[*chan int], "*chan int"},
		{"slice of func", errOf[[]func()], "[]func()"},
		{"map key", errOf[map[*chan int]int], "map[*chan int]int"},
		{"recursive", errOf[recursiveBad], "chan struct {}"},
		{"error interface", errOf[error], "error"},
		{"struct with error field", errOf[withErr], "actors.withErr"},
		{"complex in struct", errOf[withComplex], "complex128"},
		{"big complex array", errOf[[5]complex128], "[5]complex128"},
		{"proto.Message interface", errOf[proto.Message], "protoreflect.ProtoMessage"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.get()
			if !errors.Is(err, ErrUnsupportedType) {
				t.Fatalf("err = %v, want ErrUnsupportedType", err)
			}
			if !strings.HasPrefix(err.Error(), "knit: unsupported type") || !strings.Contains(err.Error(), c.names) {
				t.Fatalf("message %q does not name %q", err, c.names)
			}
		})
	}
	err := errOf[withFunc]()
	if !strings.Contains(err.Error(), ".F") {
		t.Errorf("message %q does not locate field F", err)
	}
}

func errOf[T any]() error {
	_, err := CodecFor[T]()
	return err
}

func TestCodecDecodeErrors(t *testing.T) {
	deep := bytes.Repeat([]byte{0x81}, cborMaxNestedLevels+1) // [[[[...
	deep = append(deep, 0x00)
	okDepth := append(bytes.Repeat([]byte{0x81}, cborMaxNestedLevels-1), 0x00)
	rec, _ := CodecFor[record]()
	recBytes, err := rec.Append(nil, record{Label: "truncate me", Nested: [][]int{{1, 2, 3}}})
	if err != nil {
		t.Fatal(err)
	}
	mustNotDecode := func(name string, decode func() error) {
		t.Run(name, func(t *testing.T) {
			err := decode()
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if !strings.HasPrefix(err.Error(), "knit: corrupt payload") {
				t.Fatalf("message %q", err)
			}
		})
	}
	for _, n := range []int{0, 7, 9, 16} {
		mustNotDecode(fmt.Sprintf("int64/%d bytes", n), decodeErr[int64](make([]byte, n)))
		mustNotDecode(fmt.Sprintf("float64/%d bytes", n), decodeErr[float64](make([]byte, n)))
		mustNotDecode(fmt.Sprintf("dur/%d bytes", n), decodeErr[dur](make([]byte, n)))
	}
	for _, n := range []int{0, 8, 15, 17, 32} {
		mustNotDecode(fmt.Sprintf("[2]int64/%d bytes", n), decodeErr[[2]int64](make([]byte, n)))
		mustNotDecode(fmt.Sprintf("[3]float64/%d bytes", n), decodeErr[[3]float64](make([]byte, n)))
	}
	mustNotDecode("int32/3 bytes", decodeErr[int32]([]byte{1, 2, 3}))
	mustNotDecode("int8/2 bytes", decodeErr[int8]([]byte{1, 2}))
	mustNotDecode("uint16/1 byte", decodeErr[uint16]([]byte{1}))
	mustNotDecode("int/empty", decodeErr[int](nil))
	mustNotDecode("bool/empty", decodeErr[bool](nil))
	mustNotDecode("bool/2", decodeErr[bool]([]byte{2}))
	mustNotDecode("flag/0xff", decodeErr[flag]([]byte{0xff}))
	mustNotDecode("[4]bool/bad byte", decodeErr[[4]bool]([]byte{0, 1, 3, 0}))
	mustNotDecode("[0]int64/1 byte", decodeErr[[0]int64]([]byte{0}))

	for _, n := range []int{0, 1, len(recBytes) / 2, len(recBytes) - 1} {
		mustNotDecode(fmt.Sprintf("cbor/truncated to %d", n), decodeErr[record](recBytes[:n]))
	}
	mustNotDecode("cbor/trailing byte", decodeErr[record](append(append([]byte(nil), recBytes...), 0)))
	mustNotDecode("cbor/over nesting limit into any", decodeErr[any](deep))
	mustNotDecode("cbor/over nesting limit into [][]int", decodeErr[[][]int](deep))
	mustNotDecode("cbor/indefinite length", decodeErr[[]int]([]byte{0x9f, 0x01, 0xff}))
	mustNotDecode("cbor/duplicate map key", decodeErr[map[string]int]([]byte{0xa2, 0x61, 'a', 0x01, 0x61, 'a', 0x02}))
	mustNotDecode("cbor/wrong type", decodeErr[record]([]byte{0x61, 'x'}))
	// Invalid UTF-8 is not corrupt: a Go string may hold any bytes, and crosses as it is
	// (TestCodecBinaryStrings).
	if v, err := mustCodecT[any](t).Decode([]byte{0x62, 'a', 0xff}); err != nil || v != "a\xff" {
		t.Errorf("cbor/invalid utf-8: %q, %v; want the bytes as they are", v, err)
	}
	mustNotDecode("cbor/array count lies", decodeErr[[]int]([]byte{0x9a, 0xff, 0xff, 0xff, 0xff, 0x01}))
	mustNotDecode("cbor/lone break", decodeErr[any]([]byte{0xff}))
	mustNotDecode("cbor/empty", decodeErr[any](nil))

	mustNotDecode("proto/garbage", decodeErr[*structpb.Struct]([]byte{0xff, 0xff, 0xff, 0xff}))
	mustNotDecode("proto/truncated", decodeErr[*wrapperspb.StringValue]([]byte{0x0a, 0x05, 'a'}))
	mustNotDecode("proto/invalid utf-8", decodeErr[*wrapperspb.StringValue]([]byte{0x0a, 0x01, 0xff}))

	mustNotDecode("binary/error", decodeErr[point]([]byte{1, 2, 3}))
	mustNotDecode("binary/pointer error", decodeErr[*label]([]byte{'a', 0}))
	mustNotDecode("binary/panic", decodeErr[panicky](nil))

	// Numeric times outside RFC 3339's years would decode but never encode again.
	farTime := cbor.Tag{Number: 1, Content: uint64(1) << 62}
	mustNotDecode("cbor/far time in struct", decodeErr[record](cborOf(t, map[string]any{"When": farTime})))
	mustNotDecode("cbor/far time untagged", decodeErr[record](cborOf(t, map[string]any{"When": int64(-1) << 62})))
	mustNotDecode("cbor/far time in pointer", decodeErr[*time.Time](cborOf(t, farTime)))
	mustNotDecode("cbor/far time in slice", decodeErr[[]time.Time](cborOf(t, []any{0, farTime})))
	mustNotDecode("cbor/far time in map", decodeErr[map[string]time.Time](cborOf(t, map[string]any{"a": 0, "b": farTime})))
	mustNotDecode("cbor/far time in map key", decodeErr[map[time.Time]int](cborOf(t, map[any]int{farTime: 1})))
	mustNotDecode("cbor/far time deep", decodeErr[timeNode](cborOf(t, map[string]any{
		"Next": map[string]any{"Next": map[string]any{"Times": [2]any{0, farTime}}}})))
	mustNotDecode("cbor/far time in any", decodeErr[any](cborOf(t, farTime)))

	t.Run("cbor/at nesting limit decodes", func(t *testing.T) {
		c, _ := CodecFor[any]()
		if _, err := c.Decode(okDepth); err != nil {
			t.Fatalf("depth %d: %v", cborMaxNestedLevels, err)
		}
	})
}

type timeNode struct {
	Times [2]time.Time
	Next  *timeNode
	Extra []*timeNode
}

func cborOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := cbor.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCodecTimes(t *testing.T) {
	c, err := CodecFor[timeNode]()
	if err != nil {
		t.Fatal(err)
	}
	in := timeNode{
		Times: [2]time.Time{time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)},
		Next:  &timeNode{Extra: []*timeNode{nil, {}}},
	}
	b, err := c.Append(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Times[0].Equal(in.Times[0]) || !out.Times[1].Equal(in.Times[1]) || out.Next == nil || len(out.Next.Extra) != 2 {
		t.Fatalf("round trip: %+v", out)
	}
	// A legitimate numeric time decodes.
	if v, err := c.Decode(cborOf(t, map[string]any{"Times": []any{cbor.Tag{Number: 1, Content: 1700000000}, 0}})); err != nil || v.Times[0].Unix() != 1700000000 {
		t.Fatalf("epoch time: %v, %v", v, err)
	}
	// A time out of range cannot be sent: an error, not a panic.
	if _, err := c.Append(nil, timeNode{Times: [2]time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}); err == nil {
		t.Fatal("year 10000 encoded")
	}
	// In an any, times arrive as the RFC 3339 text the encoder writes.
	a, _ := CodecFor[any]()
	v, err := a.Decode(cborOf(t, cbor.Tag{Number: 1, Content: 0}))
	if err != nil || v != "1970-01-01T00:00:00Z" {
		t.Fatalf("tag 1 into any: %#v, %v", v, err)
	}
}

func decodeErr[T any](b []byte) func() error {
	return func() error {
		c, err := CodecFor[T]()
		if err != nil {
			return err
		}
		v, err := c.Decode(b)
		if err == nil {
			return fmt.Errorf("decoded %x into %#v without error", b, v)
		}
		return err
	}
}

func TestCodecAllocs(t *testing.T) {
	allocs(t, "int64", int64(-77))
	allocs(t, "float64", math.Pi)
	allocs(t, "[2]int64", [2]int64{1, 2})
	allocs(t, "int", 5)
	allocs(t, "bool", true)
	allocs(t, "dur", dur(3))
	allocs(t, "vec3", vec3{1, 2, 3})
	allocs(t, "[2]complex64", [2]complex64{1, 2})
	allocs(t, "[4]bool", [4]bool{true})
}

func allocs[T any](t *testing.T, name string, v T) {
	t.Helper()
	c, err := CodecFor[T]()
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 0, 64)
	enc, _ := c.Append(nil, v)
	var sink T
	if n := testing.AllocsPerRun(1000, func() { dst, _ = c.Append(dst[:0], v) }); n != 0 {
		t.Errorf("%s: Append allocates %v per call", name, n)
	}
	if n := testing.AllocsPerRun(1000, func() { sink, _ = c.Decode(enc) }); n != 0 {
		t.Errorf("%s: Decode allocates %v per call", name, n)
	}
	_ = sink
}

func TestWireError(t *testing.T) {
	for _, w := range []WireError{
		{},
		{Code: "E_TIMEOUT", Message: "deadline exceeded"},
		{Message: "no code"},
		{Code: "c", Message: strings.Repeat("long message ", 10000)},
		{Code: "ü", Message: "\x00\xff binary is fine"},
		{Message: "boom", Stack: "goroutine 1 [running]:\nmain.main()\n"},
	} {
		b := EncodeWireStack([]byte("pre"), w.Code, w.Message, []byte(w.Stack))
		got, err := DecodeWireError(b[3:])
		if err != nil || got != w {
			t.Fatalf("round trip %+v: got %+v, %v", w, got, err)
		}
		if got.Error() != w.Message {
			t.Fatalf("Error() = %q, want the message %q", got.Error(), w.Message)
		}
	}
	long := strings.Repeat("é", 40000) // 80000 bytes
	got, err := DecodeWireError(EncodeWireError(nil, long, "m"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Code) > math.MaxUint16 || !strings.HasPrefix(long, got.Code) || len(got.Code)%2 != 0 {
		t.Fatalf("long code cut to %d bytes, not at a rune boundary below 65536", len(got.Code))
	}
	good := EncodeWireError(nil, "code", "message")
	for _, bad := range [][]byte{
		nil, {0}, {5, 0, 'a'}, {0, 0}, {0, 0, 1, 0, 0}, {0xff, 0xff, 0, 0, 0, 0},
		good[:len(good)-1], append(append([]byte(nil), good...), 0),
		{0, 0, 0xff, 0xff, 0xff, 0xff, 'x'},
		append(bytes.Clone(good), 0, 0, 0, 0),      // an empty stack section
		append(bytes.Clone(good), 2, 0, 0, 0, 'x'), // a stack section cut short
	} {
		if _, err := DecodeWireError(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeWireError(%x) = %v, want ErrCorrupt", bad, err)
		}
	}
}

func TestFitWireError(t *testing.T) {
	we := WireError{Code: "C", Message: strings.Repeat("m", 100), Stack: strings.Repeat("s", 1000)}
	for _, limit := range []int{2000, 500, 120, 100, 20, 0} {
		b := FitWireError(nil, we, limit)
		got, err := DecodeWireError(b)
		if err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
		if len(b) > max(limit, 7) || got.Code != "C" || !strings.HasPrefix(we.Message, got.Message) || !strings.HasPrefix(we.Stack, got.Stack) {
			t.Fatalf("limit %d: %d bytes, %+v", limit, len(b), got)
		}
		if limit >= 2000 && got != we {
			t.Fatalf("limit %d: cut although it fits", limit)
		}
		if limit >= 120 && got.Message != we.Message {
			t.Fatalf("limit %d: message cut before the stack", limit)
		}
	}
}

func TestPanicError(t *testing.T) {
	task := defineTest(t, func(context.Context, string) (int, error) { panic("secret-free message") }, Options{})
	out, o := task.RunEncoded(context.Background(), []byte("x"), nil)
	if o != Panicked {
		t.Fatalf("outcome %v", o)
	}
	we, err := DecodeWireError(out)
	if err != nil {
		t.Fatal(err)
	}
	pe := AsPanic(we)
	if pe.Error() != "panic: secret-free message" {
		t.Errorf("Error() = %q", pe.Error())
	}
	if !strings.Contains(string(pe.Stack), "TestPanicError") {
		t.Errorf("stack does not show the panicking test:\n%s", pe.Stack)
	}
	var target *PanicError
	wrapped := fmt.Errorf("call: %w", pe)
	if !errors.As(wrapped, &target) || target != pe || strings.Contains(wrapped.Error(), "goroutine") {
		t.Errorf("errors.As or message: %v", wrapped)
	}
	if AsPanic(pe) != pe {
		t.Error("AsPanic of a *PanicError is not itself")
	}
	// A task whose output does not encode reports an input/output code, not a crash.
	cyc := defineTest(t, func(context.Context, int) (*node, error) {
		n := &node{}
		n.Next = n
		return n, nil
	}, Options{})
	out, o = cyc.RunEncoded(context.Background(), []byte{1, 0, 0, 0, 0, 0, 0, 0}, nil)
	if we, err := DecodeWireError(out); o != BadOutput || err != nil || we.Code != CodeUnsupportedType || !strings.Contains(we.Message, "cyclic") {
		t.Errorf("cyclic output: %v %+v %v", o, we, err)
	}
	out, o = cyc.RunEncoded(context.Background(), []byte{1}, nil)
	if we, err := DecodeWireError(out); o != BadInput || err != nil || we.Code != CodeUnsupportedType {
		t.Errorf("bad input: %v %+v %v", o, we, err)
	}
}
