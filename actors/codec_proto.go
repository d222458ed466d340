package actors

import (
	"fmt"
	"reflect"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// protoCodec carries a concrete proto.Message type in protobuf wire format.
type protoCodec[T any] struct {
	typ string
	mt  protoreflect.MessageType // makes fresh messages without Go reflection
}

// newProtoCodec builds the codec for rule 4 of CodecFor; t implements
// proto.Message and is not an interface.
func newProtoCodec[T any](t reflect.Type) (c Codec[T], err error) {
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("%w: %v: proto message type not available: %v", ErrUnsupportedType, t, r)
		}
	}()
	// Generated messages answer ProtoReflect on a nil receiver.
	var mt protoreflect.MessageType
	if m := any(*new(T)).(proto.Message).ProtoReflect(); m != nil {
		mt = m.Type()
	}
	if mt == nil {
		return nil, fmt.Errorf("%w: %v: proto message type not available", ErrUnsupportedType, t)
	}
	if _, ok := mt.New().Interface().(T); !ok {
		return nil, fmt.Errorf("%w: %v: proto message type %s makes %T", ErrUnsupportedType, t, mt.Descriptor().FullName(), mt.New().Interface())
	}
	return protoCodec[T]{typ: t.String(), mt: mt}, nil
}

func (protoCodec[T]) Name() string { return "proto" }

func (protoCodec[T]) Append(dst []byte, v T) ([]byte, error) {
	out, err := proto.MarshalOptions{}.MarshalAppend(dst, any(v).(proto.Message))
	if err != nil {
		return dst, err
	}
	return out, nil
}

func (c protoCodec[T]) Decode(b []byte) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			var zero T
			v, err = zero, corruptf("proto %s: unmarshal panicked: %v", c.typ, r)
		}
	}()
	m := c.mt.New().Interface()
	// Unmarshal copies bytes fields out of b; it does not alias them.
	if err := (proto.UnmarshalOptions{}).Unmarshal(b, m); err != nil {
		var zero T
		return zero, corruptf("proto %s: %w", c.typ, err)
	}
	return m.(T), nil
}
