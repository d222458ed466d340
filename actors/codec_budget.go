package actors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"reflect"
	"sync"
)

// ErrOverBudget reports a CBOR payload that would make its decoder allocate more than the
// decode budget: decodeBudget(len(payload)) bytes. Decode errors wrap it together with
// ErrCorrupt; an encode refused for it (the peer would refuse the value) wraps it alone.
var ErrOverBudget = errors.New("knit: value over the decode memory budget")

// The decode budget: a CBOR payload of n bytes may make its decoder allocate at most
// budgetRatio·n + budgetFloor bytes, so a call's value costs at most budgetRatio times
// Payload.MaxCall (plus the floor) to decode, whatever a hostile peer writes. fxamacker/cbor
// bounds element counts (cborMaxArrayElements, cborMaxMapPairs) but not count × element
// size: 65 KB of empty byte strings decoding into [][8192]byte would ask for 512 MiB.
const (
	budgetRatio = 64
	budgetFloor = 1 << 20
)

func decodeBudget(n int) int { return budgetRatio*n + budgetFloor }

// needsBudget reports whether a value of t decoded from n bytes could allocate more than
// decodeBudget(n): whether t holds maps or interfaces (whose small items carry large fixed
// costs), or slices of, or pointers to, values larger than budgetRatio/2 bytes. Only such
// types have their payloads measured before decoding. Other types allocate at most
// budgetRatio/2 bytes per CBOR item (each at least a byte) plus string contents (at most the
// bytes they span): within budgetRatio per byte, with room for the decoder's own costs.
func needsBudget(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	if cborSelfCoded(t) {
		return false
	}
	if leaf, _ := cborLeaf(t); leaf {
		return t == bigIntType // bignums come as tags
	}
	switch t.Kind() {
	case reflect.Map, reflect.Interface:
		return true
	case reflect.Pointer:
		return t.Elem().Size() > budgetRatio/2 || needsBudget(t.Elem(), seen)
	case reflect.Slice:
		return t.Elem().Kind() != reflect.Uint8 && chargeOf(t.Elem()) > budgetRatio/2 || needsBudget(t.Elem(), seen)
	case reflect.Array:
		return needsBudget(t.Elem(), seen)
	case reflect.Struct:
		for _, f := range cborFields(t) {
			if embedAlloc(t, f.index) > 0 || needsBudget(f.typ, seen) {
				return true
			}
		}
	}
	return false
}

// chargeOf is what one decoded slot of type t costs: its size and the pointees of a pointer
// chain.
func chargeOf(t reflect.Type) uintptr {
	n := t.Size()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
		n += t.Size()
	}
	return n
}

// Costs of decoding into interfaces (measured on fxamacker/cbor v2.10 and Go 1.26, with
// room to spare): boxing a value, a []any per element, a cbor.Tag.
const (
	anyBox   = 16
	anyElem  = 16
	anySlice = 32
	anyTag   = 48
)

// Fixed costs the decoder pays whatever the payload's size says (measured the same way,
// with room to spare): an item that does not fit its Go type makes an error value, and the
// decoder goes on to the next item, so a payload of misfits pays for every one; a slice
// header escapes to the heap; a time, big.Int or unmarshaler leaf allocates as it parses (a
// time with an odd zone offset makes a Location); a struct map with keys no field has
// keeps them in a map of its own (duplicate detection), each boxed.
const (
	errCost   = 160
	sliceHdr  = 48
	leafCost  = 192
	unknownKV = anyBox + 24
)

// mapCost bounds what a Go map made for n entries of k+v bytes each costs (swiss tables:
// groups of 8 slots at most 7/8 full, rounded up to a power of two, plus headers).
// It saturates at math.MaxInt, which no budget admits.
func mapCost(n int, kv uintptr) int {
	slots := uint64(8)
	if n > 7 {
		slots = 1 << bits.Len64(uint64(n)*8/7)
	}
	// slots·(kv+1) + n·kv (the last term: reflect's key and value temporaries) + 128
	hi1, table := bits.Mul64(slots, uint64(kv)+1)
	hi2, temps := bits.Mul64(uint64(n), uint64(kv))
	sum, carry := bits.Add64(table, temps, 0)
	if hi1 != 0 || hi2 != 0 || carry != 0 || sum > math.MaxInt-128 {
		return math.MaxInt
	}
	return int(sum) + 128
}

// budgetWalk measures a payload against the budget by walking its CBOR items together with
// the Go type they decode into, the way fxamacker/cbor allocates: slices and maps by their
// item count, pointers by their pointee, interfaces by the generic values they become. It
// stops at the first item over the budget, before anything is allocated.
type budgetWalk struct {
	b    []byte
	off  int
	used int
	max  int
}

var errBudgetMalformed = corruptf("cbor: malformed payload")

// checkBudget returns an error wrapping ErrOverBudget if decoding b into t could allocate
// more than decodeBudget(len(b)), or one wrapping ErrCorrupt if b is not CBOR at all.
func checkBudget(t reflect.Type, b []byte) error {
	w := budgetWalk{b: b, max: decodeBudget(len(b))}
	if err := w.value(t, 0); err != nil {
		return err
	}
	return nil
}

func (w *budgetWalk) charge(n int) error {
	if n < 0 || n > w.max-w.used { // n < 0: a size that overflowed
		return fmt.Errorf("%w: decoding %d bytes would need more than %d bytes of memory", ErrOverBudget, len(w.b), w.max)
	}
	w.used += n
	return nil
}

// head reads an item head: major type, additional info, argument.
func (w *budgetWalk) head() (major, ai byte, arg uint64, err error) {
	if w.off >= len(w.b) {
		return 0, 0, 0, errBudgetMalformed
	}
	c := w.b[w.off]
	w.off++
	major, ai = c>>5, c&31
	switch {
	case ai < 24:
		return major, ai, uint64(ai), nil
	case ai <= 27:
		n := 1 << (ai - 24)
		if len(w.b)-w.off < n {
			return 0, 0, 0, errBudgetMalformed
		}
		p := w.b[w.off : w.off+n]
		w.off += n
		switch n {
		case 1:
			arg = uint64(p[0])
		case 2:
			arg = uint64(binary.BigEndian.Uint16(p))
		case 4:
			arg = uint64(binary.BigEndian.Uint32(p))
		default:
			arg = binary.BigEndian.Uint64(p)
		}
		return major, ai, arg, nil
	}
	return 0, 0, 0, errBudgetMalformed // indefinite lengths are refused by the decoder too
}

// count checks that a container of n items (each at least one byte) fits the rest of the
// payload: fxamacker/cbor checks it too, but only after we would have charged for it.
func (w *budgetWalk) count(n uint64, per int) (int, error) {
	if n > uint64(len(w.b)-w.off)/uint64(per) {
		return 0, errBudgetMalformed
	}
	return int(n), nil
}

// str skips a string's content and returns its length.
func (w *budgetWalk) str(n uint64) (int, error) {
	if n > uint64(len(w.b)-w.off) {
		return 0, errBudgetMalformed
	}
	w.off += int(n)
	return int(n), nil
}

func (w *budgetWalk) nest(depth int) (int, error) {
	if depth++; depth > cborMaxNestedLevels {
		return 0, corruptf("cbor: nested deeper than %d levels", cborMaxNestedLevels)
	}
	return depth, nil
}

// skip passes over one item, charging the bytes it spans (a copy, at most).
func (w *budgetWalk) skip(depth int) error {
	start := w.off
	if err := w.any(depth, false); err != nil {
		return err
	}
	return w.charge(w.off - start)
}

// value walks one item decoding into a value of type t.
func (w *budgetWalk) value(t reflect.Type, depth int) error {
	for t.Kind() == reflect.Pointer {
		if w.off < len(w.b) && (w.b[w.off] == 0xf6 || w.b[w.off] == 0xf7) { // null, undefined: a nil pointer
			w.off++
			return nil
		}
		t = t.Elem()
		if err := w.charge(allocSize(int(t.Size()))); err != nil {
			return err
		}
	}
	if t.Kind() == reflect.Interface {
		return w.any(depth, true)
	}
	if leaf, _ := cborLeaf(t); leaf || cborSelfCoded(t) {
		if err := w.charge(leafCost); err != nil {
			return err
		}
		return w.skip(depth)
	}
	start := w.off
	major, ai, arg, err := w.head()
	if err != nil {
		return err
	}
	for tags := 0; major == 6; tags++ { // a tag: its content decodes into t
		if tags > 0 { // as in fxamacker/cbor, tags nested in tags count as levels
			if depth, err = w.nest(depth); err != nil {
				return err
			}
		}
		if major, ai, arg, err = w.head(); err != nil {
			return err
		}
	}
	switch {
	case major == 2 || major == 3: // strings: a copy at most
		n, err := w.str(arg)
		if err != nil {
			return err
		}
		if !stringFits(t, major) {
			n += errCost
		} else if major == 2 && t.Kind() == reflect.Slice {
			n += sliceHdr
		}
		return w.charge(n)
	case major == 4 && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		if depth, err = w.nest(depth); err != nil {
			return err
		}
		n, err := w.count(arg, 1)
		if err != nil {
			return err
		}
		if t.Kind() == reflect.Slice {
			if uint64(n) > uint64(w.max-w.used)/uint64(max(t.Elem().Size(), 1)) {
				return w.charge(-1)
			}
			if err := w.charge(allocSize(n*int(t.Elem().Size())) + sliceHdr); err != nil {
				return err
			}
		}
		for i := range n {
			if t.Kind() == reflect.Array && i >= t.Len() {
				err = w.skip(depth)
			} else {
				err = w.value(t.Elem(), depth)
			}
			if err != nil {
				return err
			}
		}
		return nil
	case major == 4 && t.Kind() == reflect.Struct: // a toarray struct: fields in order
		if depth, err = w.nest(depth); err != nil {
			return err
		}
		n, err := w.count(arg, 1)
		if err != nil {
			return err
		}
		fields := cborFields(t)
		for i := range n {
			if i >= len(fields) {
				err = w.skip(depth)
			} else {
				err = w.field(t, fields[i], depth)
			}
			if err != nil {
				return err
			}
		}
		return nil
	case major == 5 && t.Kind() == reflect.Map:
		if depth, err = w.nest(depth); err != nil {
			return err
		}
		n, err := w.count(arg, 2)
		if err != nil {
			return err
		}
		if err := w.charge(mapCost(n, t.Key().Size()+t.Elem().Size())); err != nil {
			return err
		}
		for range n {
			if err := w.value(t.Key(), depth); err != nil {
				return err
			}
			if err := w.value(t.Elem(), depth); err != nil {
				return err
			}
		}
		return nil
	case major == 5 && t.Kind() == reflect.Struct:
		if depth, err = w.nest(depth); err != nil {
			return err
		}
		n, err := w.count(arg, 2)
		if err != nil {
			return err
		}
		fields := cborFields(t)
		var seen uint64 // fields met so far (the first 64): a second one is a duplicate
		unknown := false
		for range n {
			keyAt := w.off
			i, ok, err := w.key(fields)
			if err != nil {
				return err
			}
			if !ok {
				// Keys no field has are kept for duplicate detection: the first makes a
				// map for the rest of the pairs, each is boxed with its bytes.
				extra := unknownKV + w.off - keyAt
				if !unknown {
					unknown, extra = true, extra+mapCost(n, 32)
				}
				if err := w.charge(extra); err != nil {
					return err
				}
				err = w.skip(depth)
			} else {
				if i >= 64 || seen&(1<<i) != 0 {
					if err := w.charge(errCost); err != nil {
						return err
					}
				} else {
					seen |= 1 << i
				}
				err = w.field(t, fields[i], depth)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	// A number, a simple value, or anything that does not fit t (the decoder reports a misfit
	// with an error value and goes on). Walk it to its end.
	if !scalarFits(t, major, ai, arg) {
		if err := w.charge(errCost); err != nil {
			return err
		}
	}
	w.off = start
	return w.skip(depth)
}

// allocSize bounds what the allocator takes for an object of n bytes: small objects by
// size class (at most a quarter more: 4105 bytes take 4864), large ones by whole pages.
func allocSize(n int) int {
	if n > 32<<10 {
		return (n + 8<<10 - 1) &^ (8<<10 - 1)
	}
	return n + n/4
}

// stringFits reports whether a text (major 3) or byte string (major 2) decodes into t
// without an error value.
func stringFits(t reflect.Type, major byte) bool {
	switch t.Kind() {
	case reflect.String:
		return major == 3
	case reflect.Slice, reflect.Array:
		return major == 2 && t.Elem().Kind() == reflect.Uint8
	}
	return false
}

// scalarFits reports whether an item of major type 0, 1 or 7 (with its additional info and
// argument) decodes into t without an error value. Containers and strings never reach it
// fitting, so it reports false for them.
func scalarFits(t reflect.Type, major, ai byte, arg uint64) bool {
	if major == 7 && (ai == 22 || ai == 23) { // null, undefined: the zero value
		return true
	}
	switch k := t.Kind(); {
	case k >= reflect.Int && k <= reflect.Int64:
		return (major == 0 || major == 1) && arg <= uint64(1)<<(t.Bits()-1)-1
	case k >= reflect.Uint && k <= reflect.Uintptr:
		return major == 0 && (t.Bits() == 64 || arg < uint64(1)<<t.Bits())
	case k == reflect.Float32, k == reflect.Float64:
		// A float64 may overflow a float32: count every double as a misfit there.
		return major == 0 || major == 1 || major == 7 && ai >= 25 && ai <= 27 && (k == reflect.Float64 || ai < 27)
	case k == reflect.Bool:
		return major == 7 && (ai == 20 || ai == 21)
	}
	return false
}

func (w *budgetWalk) field(t reflect.Type, f cborField, depth int) error {
	if err := w.charge(int(embedAlloc(t, f.index))); err != nil {
		return err
	}
	return w.value(f.typ, depth)
}

// key reads a struct's map key and finds its field's index as fxamacker/cbor does: by exact name,
// then ignoring case, or by integer for keyasint fields.
func (w *budgetWalk) key(fields []cborField) (int, bool, error) {
	start := w.off
	major, _, arg, err := w.head()
	if err != nil {
		return 0, false, err
	}
	switch major {
	case 3:
		s := w.off
		if _, err := w.str(arg); err != nil {
			return 0, false, err
		}
		name := w.b[s:w.off]
		for i, f := range fields {
			if !f.keyAsInt && f.name == string(name) {
				return i, true, nil
			}
		}
		for i, f := range fields {
			if !f.keyAsInt && equalFold(f.name, name) {
				return i, true, nil
			}
		}
		return 0, false, nil
	case 0, 1:
		n := int64(arg)
		if major == 1 {
			n = -1 - n
		}
		for i, f := range fields {
			if f.keyAsInt && f.nameInt == n {
				return i, true, nil
			}
		}
		return 0, false, nil
	}
	w.off = start
	return 0, false, w.skip(0)
}

func equalFold(a string, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// any walks one item decoding into an interface (boxed: charge what the generic value
// costs) or, with boxed false, only passes over it.
func (w *budgetWalk) any(depth int, boxed bool) error {
	major, ai, arg, err := w.head()
	if err != nil {
		return err
	}
	cost := func(n int) error {
		if !boxed {
			return nil
		}
		return w.charge(n)
	}
	switch major {
	case 0, 1:
		return cost(anyBox)
	case 2, 3:
		n, err := w.str(arg)
		if err != nil {
			return err
		}
		return cost(anyBox + 24 + n)
	case 4:
		if depth, err = w.nest(depth); err != nil {
			return err
		}
		n, err := w.count(arg, 1)
		if err != nil {
			return err
		}
		if err := cost(anySlice + anyElem*n); err != nil {
			return err
		}
		for range n {
			if err := w.any(depth, boxed); err != nil {
				return err
			}
		}
		return nil
	case 5:
		if depth, err = w.nest(depth); err != nil {
			return err
		}
		n, err := w.count(arg, 2)
		if err != nil {
			return err
		}
		if err := cost(anyBox + mapCost(n, 32)); err != nil {
			return err
		}
		for range 2 * n {
			if err := w.any(depth, boxed); err != nil {
				return err
			}
		}
		return nil
	case 6:
		if err := cost(anyTag); err != nil {
			return err
		}
		// Tags nested in tags count as levels (as in fxamacker/cbor), looped over here
		// so that a run of tags costs no recursion.
		for w.off < len(w.b) && w.b[w.off]>>5 == 6 {
			if depth, err = w.nest(depth); err != nil {
				return err
			}
			if _, _, _, err = w.head(); err != nil {
				return err
			}
			if err := cost(anyTag); err != nil {
				return err
			}
		}
		return w.any(depth, boxed)
	}
	// Simple values and floats: the argument was the whole item.
	_ = ai
	return cost(anyBox)
}

var budgetCache sync.Map // reflect.Type → bool

// budgeted reports (once per type) whether t's payloads are measured before decoding.
func budgeted(t reflect.Type) bool {
	if b, ok := budgetCache.Load(t); ok {
		return b.(bool)
	}
	b := needsBudget(t, map[reflect.Type]bool{})
	budgetCache.Store(t, b)
	return b
}
