package actors

import (
	"fmt"
	"reflect"
)

// CheckPortable reports whether the task's values cross a process boundary intact, as they
// do between goroutines: nil if they do, else an error wrapping ErrUnsupportedType that
// names the task, the type and the field. Pools with process lanes call it for every task
// (goroutine lanes share values by reference and accept any type).
//
// CBOR carries a struct's exported fields only; a field that is unexported, and not tagged
// `cbor:"-"` (or `json:"-"`) to say it stays behind on purpose, would arrive zeroed. Types
// with their own codec (fixed-size, bytes, binary, proto, a WithCodec codec, or a type with
// MarshalCBOR or MarshalBinary) decide for themselves and pass.
func (t *Task[In, Out]) CheckPortable() error {
	if _, ok := any(t.InCodec).(cborCodec[In]); ok {
		if err := portable(reflect.TypeFor[In]()); err != nil {
			return fmt.Errorf("knit: task %q input: %w", t.name, err)
		}
	}
	if _, ok := any(t.OutCdc).(cborCodec[Out]); ok {
		if err := portable(reflect.TypeFor[Out]()); err != nil {
			return fmt.Errorf("knit: task %q output: %w", t.name, err)
		}
	}
	return nil
}

// CheckPortable calls d's CheckPortable method if it has one (every task made by Define
// does).
func CheckPortable(d Def) error {
	if p, ok := d.(interface{ CheckPortable() error }); ok {
		return p.CheckPortable()
	}
	return nil
}

// portable returns an error naming the first field of t that CBOR would drop.
func portable(t reflect.Type) error {
	if u := dropped(t, "", map[reflect.Type]bool{}); u != nil {
		return errUnsupported(t, u)
	}
	return nil
}

func dropped(t reflect.Type, path string, seen map[reflect.Type]bool) *uncarried {
	if seen[t] {
		return nil
	}
	seen[t] = true
	if leaf, _ := cborLeaf(t); leaf || cborSelfCoded(t) {
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		return dropped(t.Elem(), path, seen)
	case reflect.Slice, reflect.Array:
		return dropped(t.Elem(), path+"[i]", seen)
	case reflect.Map:
		if u := dropped(t.Key(), path+"[key]", seen); u != nil {
			return u
		}
		return dropped(t.Elem(), path+"[value]", seen)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if cborFieldCarried(f) && f.Anonymous && !f.IsExported() && f.Type.Kind() == reflect.Pointer && !leftBehind(f) {
				return &uncarried{t, path + "." + f.Name, "is an embedded pointer to an unexported struct, which the decoder " +
					"cannot set: embed the struct by value, or export its type"}
			}
			if cborFieldCarried(f) {
				if u := dropped(f.Type, path+"."+f.Name, seen); u != nil {
					return u
				}
				continue
			}
			if leftBehind(f) {
				continue
			}
			return &uncarried{t, path + "." + f.Name, fmt.Sprintf("is unexported: it would arrive zeroed on a process lane "+
				"(export it, give %v its own MarshalCBOR/UnmarshalCBOR, or tag the field `cbor:\"-\"` if it need not travel)", t)}
		}
	}
	return nil
}

// leftBehind reports a field tagged to stay behind on purpose: `cbor:"-"`, or `json:"-"`
// without a cbor tag.
func leftBehind(f reflect.StructField) bool {
	tag := f.Tag.Get("cbor")
	return tag == "-" || tag == "" && f.Tag.Get("json") == "-"
}
