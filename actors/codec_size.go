package actors

import (
	"fmt"
	"reflect"
	"unsafe"

	"google.golang.org/protobuf/proto"
)

// TooLargeError reports a value whose encoding is over the limit AppendMax was given.
// Size is its size when Exact, else a lower bound already over the limit: the value was
// refused before it was encoded, or while it was.
type TooLargeError struct {
	Size, Max int
	Exact     bool
}

func (e *TooLargeError) Error() string {
	if e.Exact {
		return fmt.Sprintf("%d bytes are over the %d-byte limit", e.Size, e.Max)
	}
	return fmt.Sprintf("over %d bytes, past the %d-byte limit", e.Size, e.Max)
}

// sizer is a codec that knows a value's encoded size without encoding it.
type sizer[T any] interface{ size(v T) int }

// bounder is a codec that can tell, without encoding, that a value's encoding is at least
// some size (what its strings and byte slices hold), looking no further than limit.
type bounder[T any] interface{ atLeast(v T, limit int) int }

// AppendMax appends v's encoding to dst unless it would be over max bytes. Codecs of raw
// bytes and strings, and proto messages, refuse such a value before encoding anything; a
// CBOR codec when the strings and byte slices the value holds are over max already. Any
// other encoding is checked once made. The error is a *TooLargeError, or the codec's own.
func AppendMax[T any](c Codec[T], dst []byte, v T, max int) ([]byte, error) {
	return limiterOf(c).appendMax(dst, v, max)
}

// limiter is a codec with what AppendMax asks of it found once: the type switch on a
// generic interface looks its itab up on every call (getitab: about 25 ns, a tenth of a
// process-lane Go), so a Task keeps its input codec's limiter (Task.AppendInput).
type limiter[T any] struct {
	c  Codec[T]
	sz sizer[T]
	bd bounder[T]
}

func limiterOf[T any](c Codec[T]) limiter[T] {
	l := limiter[T]{c: c}
	switch s := c.(type) {
	case sizer[T]:
		l.sz = s
	case bounder[T]:
		l.bd = s
	}
	return l
}

func (l limiter[T]) appendMax(dst []byte, v T, max int) ([]byte, error) {
	switch {
	case l.sz != nil:
		if n := l.sz.size(v); n > max {
			return dst, &TooLargeError{Size: n, Max: max, Exact: true}
		}
	case l.bd != nil:
		if n := l.bd.atLeast(v, max); n > max {
			return dst, &TooLargeError{Size: n, Max: max}
		}
	}
	start := len(dst)
	out, err := l.c.Append(dst, v)
	if err != nil {
		return dst, err
	}
	if n := len(out) - start; n > max {
		return dst, &TooLargeError{Size: n, Max: max, Exact: true}
	}
	return out, nil
}

func (stringCodec[T]) size(v T) int { return len(*(*string)(unsafe.Pointer(&v))) }
func (bytesCodec[T]) size(v T) int  { return len(*(*[]byte)(unsafe.Pointer(&v))) }

func (protoCodec[T]) size(v T) int {
	if m, ok := any(v).(proto.Message); ok {
		return proto.Size(m)
	}
	return 0
}

// boundVisits bounds the values atLeast looks at, so that sizing a value costs little even
// when it holds many small ones (the encoding is checked once made anyway).
const boundVisits = 256

// atLeast is a lower bound of v's CBOR encoding: the bytes of the strings and byte slices
// it holds, and a byte per element, of the first boundVisits values it reaches.
func (c cborCodec[T]) atLeast(v T, limit int) int {
	if !c.sized {
		return 0
	}
	visits := boundVisits
	return minCBOR(reflect.ValueOf(&v).Elem(), limit, &visits)
}

// minCBOR adds up what v's encoding holds at least, stopping past limit or out of visits.
func minCBOR(v reflect.Value, limit int, visits *int) int {
	if *visits <= 0 {
		return 0
	}
	*visits--
	switch v.Kind() {
	case reflect.String:
		return v.Len()
	case reflect.Slice, reflect.Array:
		switch v.Type().Elem().Kind() {
		case reflect.String, reflect.Slice, reflect.Array, reflect.Map, reflect.Struct, reflect.Pointer, reflect.Interface:
		default: // bytes, or scalars: a byte each at least, nothing further to find
			return v.Len()
		}
		n := v.Len()
		for i := 0; i < v.Len() && n <= limit && *visits > 0; i++ {
			n += minCBOR(v.Index(i), limit-n, visits)
		}
		return n
	case reflect.Map:
		n := v.Len()
		for it := v.MapRange(); it.Next() && n <= limit && *visits > 0; {
			n += minCBOR(it.Key(), limit-n, visits) + minCBOR(it.Value(), limit-n, visits)
		}
		return n
	case reflect.Struct:
		n := 0
		for i := 0; i < v.NumField() && n <= limit; i++ {
			if v.Type().Field(i).IsExported() {
				n += minCBOR(v.Field(i), limit-n, visits)
			}
		}
		return n
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return 0
		}
		return minCBOR(v.Elem(), limit, visits)
	}
	return 0
}

// holdsVariable reports whether values of t can hold strings, slices or maps, whose size
// atLeast looks at; for others it has nothing to find.
func holdsVariable(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.String, reflect.Slice, reflect.Map, reflect.Interface:
		return true
	case reflect.Array, reflect.Pointer:
		return holdsVariable(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if holdsVariable(t.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}

// AppendInput is AppendMax with the task's input codec.
func (t *Task[In, Out]) AppendInput(dst []byte, v In, max int) ([]byte, error) {
	if t.inLimit.c == nil { // a Task Define did not make
		return AppendMax(t.InCodec, dst, v, max)
	}
	return t.inLimit.appendMax(dst, v, max)
}
