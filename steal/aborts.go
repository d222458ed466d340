package steal

import "github.com/knitgo/knit/fastpath"

// A stealing pool's mapping holds, after the ring, the pool-wide abort bitmap of the calls
// on the ring: a stolen call may run on any lane, so its abort bit cannot live in one lane's
// region. Both sides find it from the ring's own size.

// MappingSize is the size of a mapping holding a ring of cfg and an abort bitmap of bits.
func MappingSize(cfg Config, bits int) (int, error) {
	n, err := Size(cfg.withDefaults())
	if err != nil {
		return 0, err
	}
	return align(n) + fastpath.BitmapSize(bits), nil
}

// Aborts is the abort bitmap of bits that follows the ring in mapping (the bytes New or Open
// were given).
func (r *Ring) Aborts(mapping []byte, bits int) (fastpath.Bitmap, error) {
	off := align(len(r.b))
	if off > len(mapping) {
		return fastpath.Bitmap{}, ErrLayout
	}
	return fastpath.BitmapOver(mapping[off:], bits)
}
