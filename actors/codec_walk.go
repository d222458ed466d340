package actors

import (
	"errors"
	"fmt"
	"reflect"
)

// ErrTooDeep reports a value that cannot be encoded because it is cyclic or nests CBOR
// arrays and maps deeper than a decoder accepts (cborMaxNestedLevels). Codec errors wrap it;
// a call whose input fails so fails with UNSUPPORTED_TYPE.
var ErrTooDeep = errors.New("knit: value too deep")

// maxPointerChain bounds pointers followed in a row without entering an array or map: only
// a cycle of pointers (type P *P) gets near it.
const maxPointerChain = 64

// maxWalkItems bounds the items the depth walk visits: a value that shares pointers can
// encode to far more than it holds, which no payload arena could take anyway.
const maxWalkItems = 1 << 26

// depthWalk checks, before encoding, that v nests at most cborMaxNestedLevels CBOR arrays and
// maps and holds no cycle. Subtrees whose type cannot nest deep enough to matter are not
// entered, so a recursive type pays for its recursive parts only. opaque reports user CBOR
// (MarshalCBOR) met inside an interface, whose nesting only the encoded bytes show.
type depthWalk struct {
	items  int
	opaque bool
	path   [cborMaxNestedLevels + maxPointerChain]uintptr // pointers on the current path, for diagnosis
	n      int
}

func (w *depthWalk) value(v reflect.Value, level, chain int) error {
	t := v.Type()
	s := shapeOf(t)
	if s.depth != unbounded && level+s.depth <= cborMaxNestedLevels {
		return nil
	}
	if w.items++; w.items > maxWalkItems {
		return fmt.Errorf("%w: more than %d items (are pointers shared many times over?)", ErrTooDeep, maxWalkItems)
	}
	if s.leaf {
		w.opaque = w.opaque || s.opaque
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		if chain++; chain > maxPointerChain {
			return w.tooDeep(v.Pointer(), "a pointer chain")
		}
		return w.enter(v.Pointer(), func() error { return w.value(v.Elem(), level, chain) })
	case reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return w.value(v.Elem(), level, chain)
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		return w.enter(v.Pointer(), func() error { return w.elems(v, level) })
	case reflect.Array:
		return w.elems(v, level)
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		return w.enter(v.Pointer(), func() error {
			if level++; level > cborMaxNestedLevels {
				return w.tooDeep(v.Pointer(), "a map")
			}
			for it := v.MapRange(); it.Next(); {
				if err := w.value(it.Key(), level, 0); err != nil {
					return err
				}
				if err := w.value(it.Value(), level, 0); err != nil {
					return err
				}
			}
			return nil
		})
	case reflect.Struct:
		if t == cborTagType {
			return w.tag(v, level)
		}
		if level++; level > cborMaxNestedLevels {
			return w.tooDeep(0, "a struct")
		}
		for _, f := range s.fields {
			fv, ok := fieldByIndex(v, f.index)
			if !ok {
				continue
			}
			if err := w.value(fv, level, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// tag walks a cbor.Tag's content. As for the decoder, a tag is no level of its own, but a
// tag directly inside a tag is.
func (w *depthWalk) tag(v reflect.Value, level int) error {
	for {
		c := v.Field(1) // Content
		for chain := 0; c.Kind() == reflect.Interface || c.Kind() == reflect.Pointer; chain++ {
			if c.IsNil() {
				return nil
			}
			if chain > maxPointerChain {
				return w.tooDeep(0, "a pointer chain")
			}
			c = c.Elem()
		}
		if c.Type() != cborTagType {
			return w.value(c, level, 0)
		}
		if level++; level > cborMaxNestedLevels {
			return w.tooDeep(0, "a tag")
		}
		if w.items++; w.items > maxWalkItems {
			return fmt.Errorf("%w: more than %d items", ErrTooDeep, maxWalkItems)
		}
		v = c
	}
}

// elems walks the elements of a slice or array (byte strings have none to walk).
func (w *depthWalk) elems(v reflect.Value, level int) error {
	if v.Type().Elem().Kind() == reflect.Uint8 {
		return nil
	}
	if level++; level > cborMaxNestedLevels {
		var p uintptr
		if v.Kind() == reflect.Slice {
			p = v.Pointer()
		}
		return w.tooDeep(p, "an array")
	}
	for i := range v.Len() {
		if err := w.value(v.Index(i), level, 0); err != nil {
			return err
		}
	}
	return nil
}

// enter records p on the path while f walks below it.
func (w *depthWalk) enter(p uintptr, f func() error) error {
	if w.n < len(w.path) {
		w.path[w.n] = p
	}
	w.n++
	err := f()
	w.n--
	return err
}

// tooDeep says whether the walk went deep because the value is cyclic (p, or a pointer
// above it, appears twice on the path) or just deep.
func (w *depthWalk) tooDeep(p uintptr, what string) error {
	path := w.path[:min(w.n, len(w.path))]
	for i, q := range path {
		if q != 0 && (q == p || slicesIndex(path[i+1:], q)) {
			return fmt.Errorf("%w: the value is cyclic (it leads back to itself), which cannot be encoded", ErrTooDeep)
		}
	}
	return fmt.Errorf("%w: %s nested more than %d arrays, maps or structs deep", ErrTooDeep, what, cborMaxNestedLevels)
}

func slicesIndex(s []uintptr, p uintptr) bool {
	for _, q := range s {
		if q == p {
			return true
		}
	}
	return false
}

// fieldByIndex is v.FieldByIndex that reports a nil embedded pointer (a field the encoder
// skips) instead of panicking.
func fieldByIndex(v reflect.Value, index []int) (reflect.Value, bool) {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v, true
}
