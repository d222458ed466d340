package actors

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"time"
	"unsafe"

	"github.com/fxamacker/cbor/v2"
)

// CBOR limits for hostile input.
const (
	cborMaxNestedLevels  = 32
	cborMaxArrayElements = 1 << 20
	cborMaxMapPairs      = 1 << 20
)

// cborEnc and cborDec are shared by every CBOR codec; modes are immutable
// and safe for concurrent use.
var cborEnc, cborDec = mustCBORModes()

func mustCBORModes() (cbor.UserBufferEncMode, cbor.DecMode) {
	eo := cbor.CoreDetEncOptions()
	eo.Time = cbor.TimeRFC3339Nano // the default, TimeUnix, drops sub-second precision
	enc, err := eo.UserBufferEncMode()
	if err != nil {
		panic(err)
	}
	dec, err := cbor.DecOptions{
		MaxNestedLevels:  cborMaxNestedLevels,
		MaxArrayElements: cborMaxArrayElements,
		MaxMapPairs:      cborMaxMapPairs,
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		// A Go string may hold any bytes, and the encoder writes them as they are: the
		// decoder takes them back as they are, so strings cross intact.
		UTF8: cbor.UTF8DecodeInvalid,
		// Times in an any come back as the RFC 3339 text the encoder writes
		// for time.Time; out-of-range tagged times are rejected.
		TimeTagToAny: cbor.TimeTagToRFC3339Nano,
	}.DecMode()
	if err != nil {
		panic(err)
	}
	return enc, dec
}

// cborCodec carries T as CBOR. CodecFor has checked T with cborCarries.
type cborCodec[T any] struct {
	typ   string
	times func(p unsafe.Pointer) error // see newTimeCheck; nil if T holds no time.Time
	// rtype is T; the flags below are worked out from it once (see codec_shape.go).
	rtype reflect.Type
	// walk: values can be cyclic or nest deeper than cborMaxNestedLevels; they are walked
	// before encoding.
	walk bool
	// opaque: values can hold CBOR of a user's making; encodings are checked for nesting.
	opaque bool
	// budget: payloads are measured against the decode budget before decoding, and
	// encodings before they are sent (the peer would refuse them).
	budget bool
	// sized: values can hold strings, slices or maps, which AppendMax sizes first.
	sized bool
}

func newCBORCodec[T any](t reflect.Type) cborCodec[T] {
	return cborCodec[T]{typ: t.String(), times: newTimeCheck(t), rtype: t,
		walk:   cborDepth(t) > cborMaxNestedLevels,
		opaque: hasOpaque(t, map[reflect.Type]bool{}),
		budget: budgeted(t), sized: holdsVariable(t, map[reflect.Type]bool{})}
}

func (cborCodec[T]) Name() string { return "cbor" }

func (c cborCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	opaque := c.opaque
	if c.walk {
		var w depthWalk
		if err := w.value(reflect.ValueOf(&v).Elem(), 0, 0); err != nil {
			return dst, fmt.Errorf("knit: cbor %s: %w", c.typ, err)
		}
		opaque = opaque || w.opaque
	}
	start := len(dst)
	buf := bytes.NewBuffer(dst)
	if err := cborEnc.MarshalToBuffer(v, buf); err != nil {
		return dst, fmt.Errorf("knit: cbor %s: %w", c.typ, err)
	}
	out := buf.Bytes()
	// What the walk cannot see (user CBOR) and what only a large encoding can hold (an
	// array or map over the decoder's element limits, each element taking a byte at
	// least) is checked on the bytes, with the decoder's own limits.
	if opaque || len(out)-start > min(cborMaxArrayElements, 2*cborMaxMapPairs) {
		if err := cborDec.Wellformed(out[start:]); err != nil {
			var deep *cbor.MaxNestedLevelError
			if errors.As(err, &deep) {
				return dst, fmt.Errorf("knit: cbor %s: %w: %w", c.typ, ErrTooDeep, err)
			}
			return dst, fmt.Errorf("knit: cbor %s: the receiving side would refuse this value: %w", c.typ, err)
		}
	}
	if c.budget {
		if err := checkBudget(c.rtype, out[start:]); err != nil {
			return dst, fmt.Errorf("knit: cbor %s: the receiving side would refuse this value: %w", c.typ, err)
		}
	}
	return out, nil
}

func (c cborCodec[T]) Decode(b []byte) (v T, err error) {
	defer func() {
		if r := recover(); r != nil { // from a user UnmarshalCBOR, UnmarshalBinary, ...
			var zero T
			v, err = zero, corruptf("cbor %s: decoder panicked: %v", c.typ, r)
		}
	}()
	if c.budget {
		if err := checkBudget(c.rtype, b); err != nil {
			if errors.Is(err, ErrCorrupt) {
				return v, err
			}
			return v, corruptf("cbor %s: %w", c.typ, err)
		}
	}
	if err := cborDec.Unmarshal(b, &v); err != nil {
		var zero T
		if errors.Is(err, ErrCorrupt) {
			return zero, err
		}
		return zero, corruptf("cbor %s: %w", c.typ, err)
	}
	if c.times != nil {
		if err := c.times(unsafe.Pointer(&v)); err != nil {
			var zero T
			return zero, corruptf("cbor %s: %w", c.typ, err)
		}
	}
	return v, nil
}

var (
	cborMarshalerType   = reflect.TypeFor[cbor.Marshaler]()
	cborUnmarshalerType = reflect.TypeFor[cbor.Unmarshaler]()
)

// uncarried describes the part of a type that cannot cross processes.
type uncarried struct {
	typ  reflect.Type
	path string // where typ sits in the top-level type; "" for the top level
	why  string
}

// cborCarries returns what in t cannot cross processes as CBOR, or nil if
// it all can. It mirrors which parts of a type fxamacker/cbor encodes:
// exported fields (and embedded structs) not tagged "-", elements, map keys
// and values, and pointees; types with their own marshal and unmarshal
// methods are trusted.
func cborCarries(t reflect.Type, path string, seen map[reflect.Type]bool) *uncarried {
	if seen[t] {
		return nil
	}
	seen[t] = true
	if cborSelfCoded(t) {
		return nil
	}
	switch t.Kind() {
	case reflect.Bool, reflect.String,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return nil
	case reflect.Chan, reflect.Func, reflect.UnsafePointer, reflect.Uintptr:
		return &uncarried{t, path, "cannot cross processes"}
	case reflect.Complex64, reflect.Complex128:
		return &uncarried{t, path, fmt.Sprintf("has no CBOR form (complex numbers travel only as fixed values of at most %d bytes)", maxFixedArray)}
	case reflect.Interface:
		if t.NumMethod() > 0 {
			return &uncarried{t, path, "is an interface with methods, which cannot be decoded: use a concrete type or any"}
		}
		return nil
	case reflect.Pointer:
		return cborCarries(t.Elem(), path, seen)
	case reflect.Slice, reflect.Array:
		return cborCarries(t.Elem(), path+"[i]", seen)
	case reflect.Map:
		if u := cborCarries(t.Key(), path+"[key]", seen); u != nil {
			return u
		}
		return cborCarries(t.Elem(), path+"[value]", seen)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if !cborFieldCarried(f) {
				continue
			}
			if u := cborCarries(f.Type, path+"."+f.Name, seen); u != nil {
				return u
			}
		}
		return nil
	}
	return &uncarried{t, path, "is of an unexpected kind"}
}

// errUnsupported formats u for the top-level type t.
func errUnsupported(t reflect.Type, u *uncarried) error {
	if u.path == "" {
		return fmt.Errorf("%w: %v %s", ErrUnsupportedType, t, u.why)
	}
	return fmt.Errorf("%w: %v: %v at %s %s", ErrUnsupportedType, t, u.typ, u.path, u.why)
}

// cborFieldCarried reports whether fxamacker/cbor encodes and decodes f:
// exported fields and embedded structs, unless tagged "-".
func cborFieldCarried(f reflect.StructField) bool {
	ft := f.Type
	for ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	if !f.IsExported() && !(f.Anonymous && ft.Kind() == reflect.Struct) {
		return false
	}
	tag := f.Tag.Get("cbor")
	if tag == "" {
		tag = f.Tag.Get("json")
	}
	return tag != "-"
}

// cborSelfCoded reports whether t decodes itself through UnmarshalCBOR or
// UnmarshalBinary, so its insides are its own business.
func cborSelfCoded(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return pt.Implements(cborMarshalerType) && pt.Implements(cborUnmarshalerType) ||
		pt.Implements(binaryMarshalerType) && pt.Implements(binaryUnmarshalerType)
}

var timeType = reflect.TypeFor[time.Time]()

// The encoder writes time.Time as RFC 3339 text, which holds only years 0
// to 9999. A peer can send numeric times far outside that, which would
// decode but could never be sent on; newTimeCheck returns a check, run after
// each decode, that rejects them. It returns nil when T holds no time.Time
// (outside interfaces, where times decode as text), so most types pay
// nothing. The check walks the decoded value through unsafe pointers with
// reflect-derived offsets, built once here.
func newTimeCheck(t reflect.Type) func(p unsafe.Pointer) error {
	b := timeCheckBuilder{memo: map[reflect.Type]*func(unsafe.Pointer) error{}}
	return b.build(t)
}

type timeCheckBuilder struct {
	memo map[reflect.Type]*func(unsafe.Pointer) error
}

func checkTime(p unsafe.Pointer) error {
	tm := (*time.Time)(p)
	if y := tm.Year(); y < 0 || y > 9999 {
		return fmt.Errorf("time in year %d cannot be encoded again", y)
	}
	return nil
}

func (b *timeCheckBuilder) build(t reflect.Type) func(unsafe.Pointer) error {
	if f, ok := b.memo[t]; ok { // recursive type: f is filled in by then
		return func(p unsafe.Pointer) error { return (*f)(p) }
	}
	if !reachesTime(t, map[reflect.Type]bool{}) {
		return nil
	}
	f := new(func(unsafe.Pointer) error)
	b.memo[t] = f
	switch t.Kind() {
	case reflect.Struct:
		if t == timeType {
			*f = checkTime
			break
		}
		type part struct {
			off   uintptr
			check func(unsafe.Pointer) error
		}
		var parts []part
		for i := range t.NumField() {
			sf := t.Field(i)
			if cborFieldCarried(sf) {
				if c := b.build(sf.Type); c != nil {
					parts = append(parts, part{sf.Offset, c})
				}
			}
		}
		*f = func(p unsafe.Pointer) error {
			for _, x := range parts {
				if err := x.check(unsafe.Add(p, x.off)); err != nil {
					return err
				}
			}
			return nil
		}
	case reflect.Pointer:
		elem := b.build(t.Elem())
		*f = func(p unsafe.Pointer) error {
			if q := *(*unsafe.Pointer)(p); q != nil {
				return elem(q)
			}
			return nil
		}
	case reflect.Array:
		elem, n, size := b.build(t.Elem()), t.Len(), t.Elem().Size()
		*f = func(p unsafe.Pointer) error {
			for i := range n {
				if err := elem(unsafe.Add(p, uintptr(i)*size)); err != nil {
					return err
				}
			}
			return nil
		}
	case reflect.Slice:
		elem := b.build(t.Elem())
		*f = func(p unsafe.Pointer) error {
			s := reflect.NewAt(t, p).Elem()
			for i := range s.Len() {
				if err := elem(s.Index(i).Addr().UnsafePointer()); err != nil {
					return err
				}
			}
			return nil
		}
	case reflect.Map:
		kt, vt := t.Key(), t.Elem()
		key, val := b.build(kt), b.build(vt)
		*f = func(p unsafe.Pointer) error {
			// Map entries are not addressable: check copies.
			for it := reflect.NewAt(t, p).Elem().MapRange(); it.Next(); {
				if key != nil {
					k := reflect.New(kt)
					k.Elem().Set(it.Key())
					if err := key(k.UnsafePointer()); err != nil {
						return err
					}
				}
				if val != nil {
					v := reflect.New(vt)
					v.Elem().Set(it.Value())
					if err := val(v.UnsafePointer()); err != nil {
						return err
					}
				}
			}
			return nil
		}
	default:
		return nil // not reached: reachesTime said no
	}
	return *f
}

// reachesTime reports whether a value of t can hold a time.Time that
// fxamacker/cbor decodes as such.
func reachesTime(t reflect.Type, seen map[reflect.Type]bool) bool {
	if t == timeType {
		return true
	}
	if seen[t] || cborSelfCoded(t) {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return reachesTime(t.Elem(), seen)
	case reflect.Map:
		return reachesTime(t.Key(), seen) || reachesTime(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); cborFieldCarried(f) && reachesTime(f.Type, seen) {
				return true
			}
		}
	}
	return false
}
