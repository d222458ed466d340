package actors

import (
	"cmp"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/fxamacker/cbor/v2"
)

// What a CBOR type's values can do to an encoder or decoder, worked out once per type from
// its type graph (see [CodecFor] rule 5 and docs/process-lanes.md, "Codec rules"):
//
//   - depth: how many CBOR arrays and maps a value can nest. A type that is recursive (through
//     pointers, slices or maps) or holds an interface has no bound: its values are walked
//     before each encode, which turns a cycle or a nesting deeper than cborMaxNestedLevels
//     into an error instead of a stack overflow. Other types pay nothing.
//   - ratio: the most memory one encoded byte can make a decoder allocate. A type whose ratio
//     is above budgetRatio (a slice of large elements, pointers to large structs) has each
//     payload measured against the decode budget before it is decoded. Other types cannot
//     exceed the budget and pay nothing.

// unbounded is the depth of a type whose values can nest without limit.
const unbounded = math.MaxInt32

var (
	bigIntType      = reflect.TypeFor[big.Int]()
	cborTagType     = reflect.TypeFor[cbor.Tag]()
	cborSimpleType  = reflect.TypeFor[cbor.SimpleValue]()
	cborByteStrType = reflect.TypeFor[cbor.ByteString]()
)

// cborLeaf reports types fxamacker/cbor encodes as one item of their own making: depth 0,
// nothing inside to walk. opaque means the bytes come from a user's MarshalCBOR (or are
// raw CBOR), so their nesting is checked on the encoded bytes instead.
func cborLeaf(t reflect.Type) (leaf, opaque bool) {
	switch t {
	case timeType, bigIntType, cborSimpleType, cborByteStrType:
		return true, false
	case cborTagType:
		return false, false
	}
	pt := reflect.PointerTo(t)
	switch {
	case t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface:
		return false, false
	case pt.Implements(cborMarshalerType):
		return true, true
	case pt.Implements(binaryMarshalerType):
		return true, false
	}
	return false, false
}

// cborField is a struct field as fxamacker/cbor sees it: embedded structs flattened,
// hidden and "-" fields dropped, name conflicts resolved as encoding/json does.
type cborField struct {
	name     string
	nameInt  int64 // keyasint fields: the name as an integer
	keyAsInt bool
	index    []int
	typ      reflect.Type
	tagged   bool
}

var fieldCache sync.Map // reflect.Type → []cborField

// cborFields lists the fields of struct type t that travel, in field order. It mirrors
// fxamacker/cbor's getFields.
func cborFields(t reflect.Type) []cborField {
	if f, ok := fieldCache.Load(t); ok {
		return f.([]cborField)
	}
	var flds []cborField
	type pending struct {
		t   reflect.Type
		idx [][]int
	}
	next := map[reflect.Type][][]int{}
	appendFields := func(t reflect.Type, idx []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if !f.IsExported() && !(f.Anonymous && ft.Kind() == reflect.Struct) {
				continue
			}
			tag := f.Tag.Get("cbor")
			if tag == "" {
				tag = f.Tag.Get("json")
			}
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			keyAsInt := slices.Contains(strings.Split(opts, ","), "keyasint")
			fi := append(slices.Clone(idx), i)
			if !f.Anonymous || ft.Kind() != reflect.Struct || name != "" {
				if name == "" {
					name = f.Name
				}
				cf := cborField{name: name, index: fi, typ: f.Type, tagged: tag != "", keyAsInt: keyAsInt}
				if keyAsInt {
					if n, err := strconv.Atoi(name); err == nil {
						cf.nameInt, cf.name = int64(n), strconv.Itoa(n)
					}
				}
				flds = append(flds, cf)
			} else {
				next[ft] = append(next[ft], fi)
			}
		}
	}
	appendFields(t, nil)
	visited := map[reflect.Type]bool{t: true}
	for len(next) > 0 {
		cur := next
		next = map[reflect.Type][][]int{}
		for _, et := range slices.SortedFunc(mapKeys(cur), func(a, b reflect.Type) int {
			return slices.Compare(cur[a][0], cur[b][0])
		}) {
			idx := cur[et]
			if len(idx) > 1 || visited[et] {
				continue
			}
			visited[et] = true
			appendFields(et, idx[0])
		}
	}
	slices.SortStableFunc(flds, func(a, b cborField) int {
		return cmp.Or(strings.Compare(a.name, b.name), cmpBool(b.keyAsInt, a.keyAsInt),
			cmp.Compare(len(a.index), len(b.index)), cmpBool(b.tagged, a.tagged), slices.Compare(a.index, b.index))
	})
	var vis []cborField
	for i := 0; i < len(flds); {
		f := flds[i]
		j := i + 1
		for j < len(flds) && flds[j].name == f.name && flds[j].keyAsInt == f.keyAsInt {
			j++
		}
		if j == i+1 || len(f.index) < len(flds[i+1].index) || (f.tagged && !flds[i+1].tagged) {
			vis = append(vis, f)
		}
		i = j
	}
	slices.SortFunc(vis, func(a, b cborField) int { return slices.Compare(a.index, b.index) })
	fieldCache.Store(t, vis)
	return vis
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// embedAlloc is what decoding into a field allocates on the way: the embedded structs
// reached through nil pointers on its index path.
func embedAlloc(t reflect.Type, index []int) uintptr {
	var n uintptr
	for _, i := range index[:len(index)-1] {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		t = t.Field(i).Type
		if t.Kind() == reflect.Pointer {
			n += t.Elem().Size()
		}
	}
	return n
}

// typeShape is what the depth walk needs of a type, looked up once per visited value.
type typeShape struct {
	depth        int
	leaf, opaque bool
	fields       []cborField // structs
}

var shapeCache sync.Map // reflect.Type → *typeShape

func shapeOf(t reflect.Type) *typeShape {
	if s, ok := shapeCache.Load(t); ok {
		return s.(*typeShape)
	}
	s := &typeShape{depth: cborDepth(t)}
	s.leaf, s.opaque = cborLeaf(t)
	if t.Kind() == reflect.Struct {
		s.fields = cborFields(t)
	}
	shapeCache.Store(t, s)
	return s
}

var depthCache sync.Map // reflect.Type → int

// cborDepth is the most CBOR arrays and maps a value of t can nest (unbounded for recursive
// types and interfaces). A map level counts once for its keys and values.
func cborDepth(t reflect.Type) int {
	if d, ok := depthCache.Load(t); ok {
		return d.(int)
	}
	return depthOf(t, map[reflect.Type]bool{})
}

func depthOf(t reflect.Type, onStack map[reflect.Type]bool) int {
	if d, ok := depthCache.Load(t); ok {
		return d.(int)
	}
	if onStack[t] { // recursive: every type on the cycle is unbounded
		return unbounded
	}
	onStack[t] = true
	defer delete(onStack, t)
	d := 0
	leaf, opaque := cborLeaf(t)
	switch {
	case opaque: // walked, so that an opaque value inside an interface is noticed
		d = unbounded
	case leaf:
	case t == cborTagType, t.Kind() == reflect.Interface:
		d = unbounded
	case t.Kind() == reflect.Pointer:
		d = depthOf(t.Elem(), onStack)
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && t.Elem().Kind() == reflect.Uint8:
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		d = addDepth(depthOf(t.Elem(), onStack))
	case t.Kind() == reflect.Map:
		d = addDepth(max(depthOf(t.Key(), onStack), depthOf(t.Elem(), onStack)))
	case t.Kind() == reflect.Struct:
		for _, f := range cborFields(t) {
			d = max(d, depthOf(f.typ, onStack))
		}
		d = addDepth(d)
	}
	depthCache.Store(t, d)
	return d
}

func addDepth(d int) int {
	if d == unbounded {
		return d
	}
	return d + 1
}

// hasOpaque reports whether a value of t can hold CBOR of a user's making (MarshalCBOR,
// cbor.RawMessage) outside interfaces; such encodings are checked for nesting after
// encoding.
func hasOpaque(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	if leaf, opaque := cborLeaf(t); leaf {
		return opaque
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return hasOpaque(t.Elem(), seen)
	case reflect.Map:
		return hasOpaque(t.Key(), seen) || hasOpaque(t.Elem(), seen)
	case reflect.Struct:
		for _, f := range cborFields(t) {
			if hasOpaque(f.typ, seen) {
				return true
			}
		}
	}
	return false
}
