package actors

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"

	"google.golang.org/protobuf/proto"
)

// Codec encodes and decodes values of one type for lanes in other processes.
// Decode receives bytes from shared memory: hostile input. It must return an error, never panic, and must not retain b.
type Codec[T any] interface {
	Name() string                           // e.g. "int64", "bytes", "string", "binary", "proto", "cbor", "fixed[2]int64"
	Append(dst []byte, v T) ([]byte, error) // appends the encoding of v to dst
	Decode(b []byte) (T, error)
}

// ErrUnsupportedType reports that a type has no codec: values of it cannot
// cross a process boundary. Errors from [CodecFor] wrap it.
var ErrUnsupportedType = errors.New("knit: unsupported type")

// ErrCorrupt reports a payload that does not decode. Errors from
// [Codec.Decode] and [DecodeWireError] wrap it.
var ErrCorrupt = errors.New("knit: corrupt payload")

// fixedSizer is implemented by the codecs of fixed-size values.
type fixedSizer interface{ fixedSize() int }

// FixedSize reports, for codecs of fixed-size scalars and small arrays of them, the exact encoded size; ok=false otherwise.
// knit places fixed values of at most fastpath.HeaderData (16) bytes in the slot header.
func FixedSize[T any](c Codec[T]) (n int, ok bool) {
	if f, ok := c.(fixedSizer); ok {
		return f.fixedSize(), true
	}
	return 0, false
}

// maxFixedArray is the largest array, in bytes, that gets a fixed-size
// codec; larger arrays go through CBOR.
const maxFixedArray = 64

// CodecFor chooses the codec for T by its type, once. Errors wrap ErrUnsupportedType.
//
// Call it when a task is defined, not per value. The choice, in order:
//
//  1. Fixed size, little-endian: bool, signed and unsigned integers
//     (int and uint in their native width), float32/64, complex64/128,
//     arrays of those of at most 64 bytes, and named types of those.
//  2. Raw bytes: string, []byte and named types of them. Decode copies;
//     an empty []byte decodes as nil.
//  3. "binary": T implements [encoding.BinaryMarshaler] and *T implements
//     [encoding.BinaryUnmarshaler], or T is a pointer implementing both.
//     UnmarshalBinary must copy what it keeps, as its contract says.
//     A nil pointer cannot be encoded.
//  4. "proto": T is a concrete [proto.Message] type, such as *pb.Foo.
//     A nil message encodes as, and decodes to, an empty one.
//  5. "cbor": everything else CBOR can carry. Types that cannot cross a
//     process boundary are rejected: chan, func, unsafe.Pointer, uintptr,
//     complex numbers (outside rule 1), interfaces with methods (such as
//     error, which cannot be decoded), and types containing any of these in
//     exported fields, elements, keys or pointees. Interfaces without
//     methods (any) are allowed. Only exported struct fields travel.
//     time.Time travels as RFC 3339 text, so only years 0 to 9999 encode
//     (and decode); inside an any, times arrive as that text, integers as
//     uint64 or int64, and maps as map[any]any.
//     A value that is cyclic or nests more than 32 arrays, maps and structs
//     does not encode (ErrTooDeep); a payload whose decoding would allocate
//     more than 64 bytes per payload byte plus 1 MiB does not decode, nor
//     encode (ErrOverBudget). Which types pay for these checks is decided
//     here, from the type graph. A struct with unexported fields is accepted
//     here (goroutine lanes carry it by reference) but refused for process
//     lanes by [Task.CheckPortable]. docs/process-lanes.md, "Codec rules",
//     has the whole picture.
//
// The codecs hold no mutable state and are safe for concurrent use.
func CodecFor[T any]() (Codec[T], error) {
	t := reflect.TypeFor[T]()
	if c := specialisedFixed[T](); c != nil {
		return c, nil
	}
	if c, ok := newLayoutCodec[T](t); ok {
		return c, nil
	}
	switch {
	case t.Kind() == reflect.String:
		return stringCodec[T]{}, nil
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		return bytesCodec[T]{}, nil
	}
	if t.Kind() != reflect.Interface {
		if c, ok := newBinaryCodec[T](t); ok {
			return c, nil
		}
		if t.Implements(reflect.TypeFor[proto.Message]()) {
			return newProtoCodec[T](t)
		}
	}
	if u := cborCarries(t, "", map[reflect.Type]bool{}); u != nil {
		return nil, errUnsupported(t, u)
	}
	return newCBORCodec[T](t), nil
}

var (
	binaryMarshalerType   = reflect.TypeFor[encoding.BinaryMarshaler]()
	binaryUnmarshalerType = reflect.TypeFor[encoding.BinaryUnmarshaler]()
	binaryAppenderType    = reflect.TypeFor[encoding.BinaryAppender]()
)

// corruptf returns an error wrapping ErrCorrupt.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}
