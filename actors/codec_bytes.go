package actors

import "unsafe"

// stringCodec carries a T whose underlying type is string as its raw bytes.
// CodecFor checks the kind; the conversion through unsafe.Pointer only
// reinterprets T as its underlying type, so named types need no reflection.
type stringCodec[T any] struct{}

func (stringCodec[T]) Name() string { return "string" }

func (stringCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	return append(dst, *(*string)(unsafe.Pointer(&v))...), nil
}

func (stringCodec[T]) Decode(b []byte) (T, error) {
	var v T
	*(*string)(unsafe.Pointer(&v)) = string(b) // copies
	return v, nil
}

// bytesCodec carries a T whose underlying type is a slice of a uint8 kind
// as its raw bytes. Decode copies; empty payloads decode as nil.
type bytesCodec[T any] struct{}

func (bytesCodec[T]) Name() string { return "bytes" }

func (bytesCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	return append(dst, *(*[]byte)(unsafe.Pointer(&v))...), nil
}

func (bytesCodec[T]) Decode(b []byte) (T, error) {
	var v T
	if len(b) > 0 {
		*(*[]byte)(unsafe.Pointer(&v)) = append([]byte(nil), b...)
	}
	return v, nil
}
