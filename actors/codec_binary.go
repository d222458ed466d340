package actors

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"unsafe"
)

// binaryCodec uses T's MarshalBinary (or AppendBinary) and UnmarshalBinary.
type binaryCodec[T any] struct {
	typ      string
	appender bool         // T implements encoding.BinaryAppender
	elem     reflect.Type // when T is a pointer: its element, allocated per Decode
}

// newBinaryCodec returns a binaryCodec when t qualifies for rule 3 of CodecFor.
func newBinaryCodec[T any](t reflect.Type) (Codec[T], bool) {
	if !t.Implements(binaryMarshalerType) {
		return nil, false
	}
	c := binaryCodec[T]{typ: t.String(), appender: t.Implements(binaryAppenderType)}
	switch {
	case reflect.PointerTo(t).Implements(binaryUnmarshalerType):
	case t.Kind() == reflect.Pointer && t.Implements(binaryUnmarshalerType):
		c.elem = t.Elem()
	default:
		return nil, false
	}
	return c, true
}

func (binaryCodec[T]) Name() string { return "binary" }

func (c binaryCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	if c.elem != nil && *(*unsafe.Pointer)(unsafe.Pointer(&v)) == nil {
		return dst, fmt.Errorf("knit: binary codec: cannot encode nil %s", c.typ)
	}
	if c.appender {
		out, err := any(v).(encoding.BinaryAppender).AppendBinary(dst)
		if err != nil {
			return dst, err
		}
		return out, nil
	}
	b, err := any(v).(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

func (c binaryCodec[T]) Decode(b []byte) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			var zero T
			v, err = zero, corruptf("%s.UnmarshalBinary panicked: %v", c.typ, r)
		}
	}()
	var u encoding.BinaryUnmarshaler
	if c.elem != nil {
		// The one reflective step per call: allocating the pointee.
		v = reflect.New(c.elem).Interface().(T)
		u = any(v).(encoding.BinaryUnmarshaler)
	} else {
		u = any(&v).(encoding.BinaryUnmarshaler)
	}
	if err := u.UnmarshalBinary(b); err != nil {
		var zero T
		if errors.Is(err, ErrCorrupt) {
			return zero, err
		}
		return zero, corruptf("%s: %w", c.typ, err)
	}
	return v, nil
}
