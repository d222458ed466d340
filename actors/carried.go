package actors

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Carried context fields: when a pool propagates context values into process lanes (a trace
// context, say), each call's encoded input opens with them — a uvarint length, then that many
// bytes of (uvarint key length, key, uvarint value length, value) pairs.

// MaxCarried bounds the carried fields of one call.
const MaxCarried = 4096

// ErrCarried reports carried fields that break the format.
var ErrCarried = errors.New("knit: corrupt carried context fields")

// AppendCarried appends the fields given by each (it calls add once per pair) as a carried
// record. Fields past MaxCarried are left out whole.
func AppendCarried(dst []byte, each func(add func(key, value string))) []byte {
	start := len(dst)
	dst = append(dst, 0, 0) // room for a two-byte uvarint length: MaxCarried < 1<<14
	each(func(k, v string) {
		n := len(dst) - start - 2
		if n+2*binary.MaxVarintLen16+len(k)+len(v) > MaxCarried {
			return
		}
		dst = binary.AppendUvarint(dst, uint64(len(k)))
		dst = append(dst, k...)
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	})
	n := len(dst) - start - 2
	dst[start] = byte(n) | 0x80 // a two-byte uvarint, even for a short length
	dst[start+1] = byte(n >> 7)
	return dst
}

// SplitCarried separates an input's carried record from the value after it.
func SplitCarried(in []byte) (fields, rest []byte, err error) {
	n, k := binary.Uvarint(in)
	if k <= 0 || n > MaxCarried || n > uint64(len(in)-k) {
		return nil, nil, fmt.Errorf("%w: length", ErrCarried)
	}
	return in[k : k+int(n)], in[k+int(n):], nil
}

// EachCarried calls fn for each pair of a carried record, stopping at the first error.
func EachCarried(fields []byte, fn func(key, value string)) error {
	for len(fields) > 0 {
		var kv [2]string
		for i := range kv {
			n, k := binary.Uvarint(fields)
			if k <= 0 || n > uint64(len(fields)-k) {
				return fmt.Errorf("%w: field length", ErrCarried)
			}
			kv[i] = string(fields[k : k+int(n)])
			fields = fields[k+int(n):]
		}
		fn(kv[0], kv[1])
	}
	return nil
}
