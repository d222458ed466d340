package actors

import (
	"encoding/binary"
	"math"
	"reflect"
	"strconv"
	"unsafe"
)

// Fixed-size codecs. The common types get a specialised codec picked by a
// type switch; other scalars, named scalar types and arrays get a
// layoutCodec, which copies T's memory after checking its layout once with
// reflect. Neither reflects nor allocates per call.

// specialisedFixed returns the specialised codec for T, or nil.
func specialisedFixed[T any]() Codec[T] {
	var c any
	switch any(*new(T)).(type) {
	case bool:
		c = boolCodec{}
	case int:
		c = intCodec[int]{"int"}
	case int8:
		c = intCodec[int8]{"int8"}
	case int16:
		c = intCodec[int16]{"int16"}
	case int32:
		c = intCodec[int32]{"int32"}
	case int64:
		c = intCodec[int64]{"int64"}
	case uint:
		c = intCodec[uint]{"uint"}
	case uint8:
		c = intCodec[uint8]{"uint8"}
	case uint16:
		c = intCodec[uint16]{"uint16"}
	case uint32:
		c = intCodec[uint32]{"uint32"}
	case uint64:
		c = intCodec[uint64]{"uint64"}
	case float32:
		c = float32Codec{}
	case float64:
		c = float64Codec{}
	case [2]int64:
		c = pairInt64Codec{}
	default:
		return nil
	}
	return c.(Codec[T])
}

// errFixedLen reports a fixed-size payload of the wrong length. It skips
// fmt until the message is wanted: hostile peers may send many.
func errFixedLen(name string, want, got int) error {
	return &lengthError{name, want, got}
}

type lengthError struct {
	name      string
	want, got int
}

func (e *lengthError) Error() string {
	return ErrCorrupt.Error() + ": " + e.name + ": want " + strconv.Itoa(e.want) + " bytes, got " + strconv.Itoa(e.got)
}

func (e *lengthError) Unwrap() error { return ErrCorrupt }

var errBadBool = corruptf("bool: byte other than 0 or 1")

type integer interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64 | ~uint | ~uint8 | ~uint16 | ~uint32 | ~uint64
}

// intCodec encodes an integer in its own width; int and uint use the
// platform's width, since lanes share one machine.
type intCodec[T integer] struct{ name string }

func (c intCodec[T]) Name() string { return c.name }

func (intCodec[T]) fixedSize() int { return int(unsafe.Sizeof(T(0))) }

func (intCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	switch unsafe.Sizeof(v) {
	case 1:
		return append(dst, byte(v)), nil
	case 2:
		return binary.LittleEndian.AppendUint16(dst, uint16(v)), nil
	case 4:
		return binary.LittleEndian.AppendUint32(dst, uint32(v)), nil
	default:
		return binary.LittleEndian.AppendUint64(dst, uint64(v)), nil
	}
}

func (c intCodec[T]) Decode(b []byte) (T, error) {
	n := int(unsafe.Sizeof(T(0)))
	if len(b) != n {
		return 0, errFixedLen(c.name, n, len(b))
	}
	switch n {
	case 1:
		return T(b[0]), nil
	case 2:
		return T(binary.LittleEndian.Uint16(b)), nil
	case 4:
		return T(binary.LittleEndian.Uint32(b)), nil
	default:
		return T(binary.LittleEndian.Uint64(b)), nil
	}
}

type boolCodec struct{}

func (boolCodec) Name() string   { return "bool" }
func (boolCodec) fixedSize() int { return 1 }

func (boolCodec) Append(dst []byte, v bool) ([]byte, error) {
	if v {
		return append(dst, 1), nil
	}
	return append(dst, 0), nil
}

func (boolCodec) Decode(b []byte) (bool, error) {
	if len(b) != 1 {
		return false, errFixedLen("bool", 1, len(b))
	}
	switch b[0] {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, errBadBool
}

type float32Codec struct{}

func (float32Codec) Name() string   { return "float32" }
func (float32Codec) fixedSize() int { return 4 }

func (float32Codec) Append(dst []byte, v float32) ([]byte, error) {
	return binary.LittleEndian.AppendUint32(dst, math.Float32bits(v)), nil
}

func (float32Codec) Decode(b []byte) (float32, error) {
	if len(b) != 4 {
		return 0, errFixedLen("float32", 4, len(b))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b)), nil
}

type float64Codec struct{}

func (float64Codec) Name() string   { return "float64" }
func (float64Codec) fixedSize() int { return 8 }

func (float64Codec) Append(dst []byte, v float64) ([]byte, error) {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(v)), nil
}

func (float64Codec) Decode(b []byte) (float64, error) {
	if len(b) != 8 {
		return 0, errFixedLen("float64", 8, len(b))
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b)), nil
}

type pairInt64Codec struct{}

func (pairInt64Codec) Name() string   { return "fixed[2]int64" }
func (pairInt64Codec) fixedSize() int { return 16 }

func (pairInt64Codec) Append(dst []byte, v [2]int64) ([]byte, error) {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(v[0]))
	return binary.LittleEndian.AppendUint64(dst, uint64(v[1])), nil
}

func (pairInt64Codec) Decode(b []byte) ([2]int64, error) {
	if len(b) != 16 {
		return [2]int64{}, errFixedLen("fixed[2]int64", 16, len(b))
	}
	return [2]int64{
		int64(binary.LittleEndian.Uint64(b)),
		int64(binary.LittleEndian.Uint64(b[8:])),
	}, nil
}

// hostLittleEndian reports whether memory order is the wire order, so a
// layoutCodec may copy a whole value at once.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// layoutCodec encodes a fixed-size T whose memory is n leaf scalars of size
// bytes each, without padding: a scalar, or an array (of arrays) of one
// scalar kind. Complex numbers are two floats.
type layoutCodec[T any] struct {
	name   string
	size   int  // bytes per leaf: 1, 2, 4 or 8
	n      int  // leaves
	bools  bool // leaves are bool: only 0 and 1 decode
	native bool // memory order is wire order: copy bytes
}

// newLayoutCodec returns a layoutCodec when t qualifies for rule 1 of CodecFor.
func newLayoutCodec[T any](t reflect.Type) (Codec[T], bool) {
	leaf, n, ok := fixedLeaf(t)
	if !ok {
		return nil, false
	}
	if t.Kind() == reflect.Array && t.Size() > maxFixedArray {
		return nil, false
	}
	name := fixedName(t)
	if t.Kind() == reflect.Array {
		name = "fixed" + name
	}
	size := int(leaf.Size())
	if leaf.Kind() == reflect.Complex64 || leaf.Kind() == reflect.Complex128 {
		size /= 2
		n *= 2
	}
	if uintptr(size*n) != t.Size() { // not expected; refuse rather than misencode
		return nil, false
	}
	return layoutCodec[T]{
		name:   name,
		size:   size,
		n:      n,
		bools:  leaf.Kind() == reflect.Bool,
		native: hostLittleEndian || size == 1,
	}, true
}

// fixedLeaf returns the scalar type at the bottom of t and how many of it t
// holds, if t is a fixed scalar or an array of them.
func fixedLeaf(t reflect.Type) (leaf reflect.Type, n int, ok bool) {
	switch t.Kind() {
	case reflect.Bool,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return t, 1, true
	case reflect.Array:
		leaf, n, ok := fixedLeaf(t.Elem())
		if !ok || t.Len() > maxFixedArray {
			return nil, 0, false
		}
		return leaf, n * t.Len(), true
	}
	return nil, 0, false
}

// fixedName names the wire form of t: its kind, or [N] and the element's.
func fixedName(t reflect.Type) string {
	if t.Kind() == reflect.Array {
		return "[" + strconv.Itoa(t.Len()) + "]" + fixedName(t.Elem())
	}
	return t.Kind().String()
}

func (c layoutCodec[T]) Name() string   { return c.name }
func (c layoutCodec[T]) fixedSize() int { return c.size * c.n }

func (c layoutCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	p := unsafe.Pointer(&v)
	if c.native {
		return append(dst, unsafe.Slice((*byte)(p), c.size*c.n)...), nil
	}
	for i := range c.n {
		q := unsafe.Add(p, i*c.size)
		switch c.size {
		case 2:
			dst = binary.LittleEndian.AppendUint16(dst, *(*uint16)(q))
		case 4:
			dst = binary.LittleEndian.AppendUint32(dst, *(*uint32)(q))
		case 8:
			dst = binary.LittleEndian.AppendUint64(dst, *(*uint64)(q))
		}
	}
	return dst, nil
}

func (c layoutCodec[T]) Decode(b []byte) (T, error) {
	var v T
	if len(b) != c.size*c.n {
		return v, errFixedLen(c.name, c.size*c.n, len(b))
	}
	if c.bools {
		for _, x := range b {
			if x > 1 {
				return v, errBadBool
			}
		}
	}
	p := unsafe.Pointer(&v)
	if c.native {
		copy(unsafe.Slice((*byte)(p), len(b)), b)
		return v, nil
	}
	for i := range c.n {
		q, w := unsafe.Add(p, i*c.size), b[i*c.size:]
		switch c.size {
		case 2:
			*(*uint16)(q) = binary.LittleEndian.Uint16(w)
		case 4:
			*(*uint32)(q) = binary.LittleEndian.Uint32(w)
		case 8:
			*(*uint64)(q) = binary.LittleEndian.Uint64(w)
		}
	}
	return v, nil
}
