package actors

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// chain builds a list of n nodes.
func chain(n int) *node {
	var head *node
	for i := range n {
		head = &node{Val: i, Next: head}
	}
	return head
}

// nestAny nests n []any arrays.
func nestAny(n int) any {
	var v any = "leaf"
	for range n {
		v = []any{v}
	}
	return v
}

func TestCodecShape(t *testing.T) {
	for _, c := range []struct {
		typ        reflect.Type
		walk, budg bool
	}{
		{reflect.TypeFor[int64](), false, false},
		{reflect.TypeFor[string](), false, false},
		{reflect.TypeFor[[]int64](), false, false},
		{reflect.TypeFor[inner](), false, false},
		{reflect.TypeFor[[][]int](), false, false},
		{reflect.TypeFor[node](), true, false}, // a node's 16 bytes per map item are within the ratio
		{reflect.TypeFor[*node](), true, false},
		{reflect.TypeFor[any](), true, true},
		{reflect.TypeFor[record](), true, true},
		{reflect.TypeFor[map[string]int](), false, true},
		{reflect.TypeFor[[][8192]byte](), false, true},
		{reflect.TypeFor[[]*big.Int](), false, true},
	} {
		walk := cborDepth(c.typ) > cborMaxNestedLevels
		if walk != c.walk || budgeted(c.typ) != c.budg {
			t.Errorf("%v: walk %v (depth %d), budget %v; want %v, %v", c.typ, walk, cborDepth(c.typ), budgeted(c.typ), c.walk, c.budg)
		}
	}
	type deep struct {
		A [1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1][1]int
	}
	if d := cborDepth(reflect.TypeFor[deep]()); d != 33 {
		t.Errorf("depth of 32 arrays in a struct = %d, want 33", d)
	}
}

func TestCodecCycles(t *testing.T) {
	nc := mustCodecT[*node](t)
	loop := &node{Val: 1}
	loop.Next = loop
	two := &node{Val: 1, Next: &node{Val: 2}}
	two.Next.Next = two
	for name, v := range map[string]*node{"self": loop, "pair": two} {
		_, err := nc.Append(nil, v)
		if !errors.Is(err, ErrTooDeep) || !strings.Contains(err.Error(), "cyclic") {
			t.Errorf("%s: Append = %v, want ErrTooDeep naming a cycle", name, err)
		}
	}
	ac := mustCodecT[any](t)
	s := []any{1, nil}
	s[1] = s
	m := map[string]any{}
	m["me"] = m
	for name, v := range map[string]any{"slice": s, "map": m} {
		if _, err := ac.Append(nil, v); !errors.Is(err, ErrTooDeep) || !strings.Contains(err.Error(), "cyclic") {
			t.Errorf("%s: Append = %v, want ErrTooDeep naming a cycle", name, err)
		}
	}
	type ptr *ptr
	pc := mustCodecT[ptr](t)
	var p ptr = new(ptr)
	*p = p
	if _, err := pc.Append(nil, p); !errors.Is(err, ErrTooDeep) {
		t.Errorf("pointer loop: Append = %v, want ErrTooDeep", err)
	}
	// A shared (acyclic) node is fine.
	shared := &node{Val: 9}
	if _, err := mustCodecT[[]*node](t).Append(nil, []*node{shared, shared}); err != nil {
		t.Errorf("shared pointer: %v", err)
	}
}

func TestCodecDepth(t *testing.T) {
	nc := mustCodecT[*node](t)
	// A node is a CBOR map: 32 nodes nest 32 levels, the decoder's limit.
	for _, n := range []int{1, 31, 32} {
		b, err := nc.Append(nil, chain(n))
		if err != nil {
			t.Fatalf("%d nodes: %v", n, err)
		}
		got, err := nc.Decode(b)
		if err != nil {
			t.Fatalf("%d nodes: decode: %v", n, err)
		}
		if got.Val != n-1 {
			t.Fatalf("%d nodes: head %d", n, got.Val)
		}
	}
	if _, err := nc.Append(nil, chain(33)); !errors.Is(err, ErrTooDeep) || strings.Contains(err.Error(), "cyclic") {
		t.Errorf("33 nodes: Append = %v, want ErrTooDeep (not a cycle)", err)
	}
	ac := mustCodecT[any](t)
	if b, err := ac.Append(nil, nestAny(32)); err != nil {
		t.Errorf("32 arrays: %v", err)
	} else if _, err := ac.Decode(b); err != nil {
		t.Errorf("32 arrays: decode: %v", err)
	}
	if _, err := ac.Append(nil, nestAny(33)); !errors.Is(err, ErrTooDeep) {
		t.Errorf("33 arrays: Append = %v, want ErrTooDeep", err)
	}
	// Tags: as for the decoder, a tag in a tag is a level, a tag alone is not.
	var tags any = 1
	for range 32 {
		tags = cbor.Tag{Number: 100, Content: tags}
	}
	tags = cbor.Tag{Number: 100, Content: tags} // 33 tags: 32 levels
	if b, err := ac.Append(nil, tags); err != nil {
		t.Errorf("33 tags: %v", err)
	} else if _, err := ac.Decode(b); err != nil {
		t.Errorf("33 tags: decode: %v", err)
	}
	if _, err := ac.Append(nil, []any{tags}); !errors.Is(err, ErrTooDeep) {
		t.Errorf("33 tags in an array: Append = %v, want ErrTooDeep", err)
	}
	type ptr *ptr
	var p ptr = new(ptr)
	*p = p
	if _, err := ac.Append(nil, cbor.Tag{Number: 100, Content: p}); !errors.Is(err, ErrTooDeep) {
		t.Errorf("tag of a pointer loop: Append = %v, want ErrTooDeep", err)
	}
	// Deep raw CBOR inside an any is caught on the encoded bytes.
	raw := cbor.RawMessage(bytes.Repeat([]byte{0x81}, 40))
	raw = append(raw, 0x01)
	if _, err := ac.Append(nil, raw); !errors.Is(err, ErrTooDeep) {
		t.Errorf("deep RawMessage: Append = %v, want ErrTooDeep", err)
	}
}

// forged returns a CBOR array of n empty byte strings: 1 byte each.
func forged(n int) []byte {
	var h []byte
	switch {
	case n < 24:
		h = []byte{0x80 | byte(n)}
	case n < 1<<16:
		h = []byte{0x99, byte(n >> 8), byte(n)}
	default:
		h = []byte{0x9a, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	}
	return append(h, bytes.Repeat([]byte{0x40}, n)...)
}

// allocated runs f and returns the bytes the process allocated meanwhile.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestCodecDecodeBudget(t *testing.T) {
	c := mustCodecT[[][8192]byte](t)
	for _, n := range []int{65536, 1 << 20} {
		in := forged(n)
		var err error
		got := allocated(func() { _, err = c.Decode(in) })
		if !errors.Is(err, ErrOverBudget) || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d empty strings: Decode = %v, want ErrOverBudget and ErrCorrupt", n, err)
		}
		if limit := uint64(decodeBudget(len(in))); got > limit {
			t.Fatalf("%d empty strings: allocated %d bytes, budget %d", n, got, limit)
		}
	}
	// Honest values of the same type round-trip.
	v := make([][8192]byte, 100)
	v[7][3] = 1
	b, err := c.Append(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Decode(b); err != nil || !reflect.DeepEqual(got, v) {
		t.Fatalf("round trip: %v", err)
	}
	// Pointers to large values: a null is free, an empty map costs the pointee.
	type bigT struct {
		A [4096]byte `cbor:"-"` // allocated, never sent
	}
	pc := mustCodecT[[]*bigT](t)
	nulls := append([]byte{0x9a, 0, 1, 0, 0}, bytes.Repeat([]byte{0xf6}, 1<<16)...)
	if _, err := pc.Decode(nulls); err != nil {
		t.Errorf("nulls: %v", err)
	}
	empties := append([]byte{0x9a, 0, 1, 0, 0}, bytes.Repeat([]byte{0xa0}, 1<<16)...)
	if _, err := pc.Decode(empties); !errors.Is(err, ErrOverBudget) {
		t.Errorf("empty maps into *[4096]byte structs: %v, want ErrOverBudget", err)
	}
	// The sender refuses what the receiver would: an encoding of such a value fails
	// before it leaves.
	many := make([]*bigT, 1<<12)
	for i := range many {
		many[i] = &bigT{}
	}
	if _, err := pc.Append(nil, many); !errors.Is(err, ErrOverBudget) {
		t.Errorf("Append of %d empty *bigT = %v, want ErrOverBudget", len(many), err)
	}
	// Maps and interfaces are budgeted too.
	mc := mustCodecT[map[int64][]int64](t)
	mb := []byte{0xb9, 0xff, 0xff}
	for i := range 0xffff {
		mb = append(mb, 0x19, byte(i>>8), byte(i), 0x80)
	}
	if _, err := mc.Decode(mb); err != nil {
		t.Errorf("map of %d empty slices: %v", 0xffff, err)
	}
}

func TestCheckPortable(t *testing.T) {
	type hidden struct {
		Name   string
		secret int
	}
	type left struct {
		Name   string
		secret int `cbor:"-"`
	}
	type embedsHidden struct {
		In []map[string]*hidden
	}
	type embedsPointer struct {
		*inner2
		B int
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{(&Task[hidden, int]{name: "h", InCodec: mustCodecT[hidden](t), OutCdc: mustCodecT[int](t)}).CheckPortable(), `task "h" input: knit: unsupported type: actors.hidden: actors.hidden at .secret is unexported`},
		{(&Task[int, embedsHidden]{name: "e", InCodec: mustCodecT[int](t), OutCdc: mustCodecT[embedsHidden](t)}).CheckPortable(), `.In[i][value].secret`},
		{(&Task[embedsPointer, int]{name: "p", InCodec: mustCodecT[embedsPointer](t), OutCdc: mustCodecT[int](t)}).CheckPortable(), `.inner2 is an embedded pointer`},
		// record's hidden chan would arrive nil.
		{(&Task[record, int]{name: "r", InCodec: mustCodecT[record](t), OutCdc: mustCodecT[int](t)}).CheckPortable(), `at .hidden`},
	} {
		if !errors.Is(c.err, ErrUnsupportedType) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("CheckPortable = %v, want ErrUnsupportedType mentioning %q and the field", c.err, c.want)
		}
	}
	for name, err := range map[string]error{
		"tagged":  (&Task[left, int]{name: "l", InCodec: mustCodecT[left](t), OutCdc: mustCodecT[int](t)}).CheckPortable(),
		"inner":   (&Task[inner, []inner]{name: "i", InCodec: mustCodecT[inner](t), OutCdc: mustCodecT[[]inner](t)}).CheckPortable(),
		"big":     (&Task[*big.Int, int]{name: "b", InCodec: mustCodecT[*big.Int](t), OutCdc: mustCodecT[int](t)}).CheckPortable(),
		"binary":  (&Task[point, label]{name: "p", InCodec: mustCodecT[point](t), OutCdc: mustCodecT[label](t)}).CheckPortable(),
		"wrapped": CheckPortable(&Task[hidden, int]{name: "w", InCodec: userCodec[hidden]{}, OutCdc: mustCodecT[int](t)}),
	} {
		if err != nil {
			t.Errorf("%s: CheckPortable = %v, want nil", name, err)
		}
	}
}

// userCodec stands for a WithCodec codec: it decides for itself what travels.
type userCodec[T any] struct{}

func (userCodec[T]) Name() string                           { return "user" }
func (userCodec[T]) Append(dst []byte, _ T) ([]byte, error) { return dst, nil }
func (userCodec[T]) Decode([]byte) (T, error)               { var v T; return v, nil }

func mustCodecT[T any](t *testing.T) Codec[T] {
	t.Helper()
	c, err := CodecFor[T]()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCodecElementLimit(t *testing.T) {
	c := mustCodecT[[]bool](t)
	if _, err := c.Append(nil, make([]bool, cborMaxArrayElements)); err != nil {
		t.Fatalf("%d elements: %v", cborMaxArrayElements, err)
	}
	_, err := c.Append(nil, make([]bool, cborMaxArrayElements+1))
	var tooMany *cbor.MaxArrayElementsError
	if !errors.As(err, &tooMany) {
		t.Fatalf("%d elements: Append = %v, want the decoder's element limit", cborMaxArrayElements+1, err)
	}
}

type inner2 struct{ A int }

func TestCodecBinaryStrings(t *testing.T) {
	type named struct {
		S string
		M map[string]string
	}
	c := mustCodecT[named](t)
	v := named{S: "\xff\xfe", M: map[string]string{"\x80": "\xc3"}}
	b, err := c.Append(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Decode(b)
	if err != nil || !reflect.DeepEqual(got, v) {
		t.Fatalf("strings with invalid UTF-8: %+v, %v", got, err)
	}
}

func TestMapCostSaturates(t *testing.T) {
	if got := mapCost(1<<40, 1<<30); got != math.MaxInt {
		t.Fatalf("mapCost of 2^40 entries of 1 GiB = %d, want MaxInt", got)
	}
	if got := mapCost(1, 16); got <= 16 || got > 1<<10 {
		t.Fatalf("mapCost(1, 16) = %d", got)
	}
	huge := mustCodecT[map[int8][1 << 30]byte](t)
	if _, err := huge.Decode([]byte{0xa1, 0x01, 0x40}); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("one entry of 1 GiB: %v, want ErrOverBudget", err)
	}
}

// Field resolution must match fxamacker/cbor's, or the budget walk would charge the wrong
// types: compare the names cborFields lists with the keys the encoder writes.
func TestCBORFieldsMatchEncoder(t *testing.T) {
	type Base struct {
		A, B int
		C    string `cbor:"c"`
	}
	type Other struct {
		A int
		D int `json:"dee"`
	}
	type hiddenBase struct{ H int }
	type Deep struct{ Base }
	type withEmbeds struct {
		Base
		*Other
		hiddenBase
		B    string // shadows Base.B
		Skip int    `cbor:"-"`
		K    int    `cbor:"7,keyasint"`
		x    int
	}
	type conflict struct {
		Base
		Deep // Deep.Base is deeper: Base's fields win
	}
	for _, v := range []any{
		withEmbeds{Base: Base{1, 2, "c"}, Other: &Other{3, 4}, hiddenBase: hiddenBase{5}, B: "b", Skip: 6, K: 7, x: 8},
		conflict{Base: Base{1, 2, "c"}, Deep: Deep{Base{3, 4, "d"}}},
	} {
		b, err := cbor.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[any]any
		if err := cbor.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		var enc, ours []string
		for k := range m {
			enc = append(enc, fmt.Sprint(k))
		}
		for _, f := range cborFields(reflect.TypeOf(v)) {
			ours = append(ours, f.name)
		}
		slices.Sort(enc)
		slices.Sort(ours)
		if !slices.Equal(enc, ours) {
			t.Errorf("%T: encoder writes %q, cborFields lists %q", v, enc, ours)
		}
	}
}
