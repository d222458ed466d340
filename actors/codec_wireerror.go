package actors

import (
	"encoding/binary"
	"math"
	"unicode/utf8"
)

// WireError carries a task error across processes: its message, and a code string if the error has one.
type WireError struct {
	Code    string
	Message string
}

// Error returns the message: the text of the error on the other side.
func (e WireError) Error() string { return e.Message }

// EncodeWireError appends the wire form of an error to dst: a little-endian
// u16 code length, the code, a u32 message length, the message. A code
// longer than 65535 bytes (or a message longer than 4 GiB) is cut at a rune
// boundary.
func EncodeWireError(dst []byte, code, msg string) []byte {
	code = truncateRunes(code, math.MaxUint16)
	msg = truncateRunes(msg, math.MaxUint32)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(code)))
	dst = append(dst, code...)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(msg)))
	return append(dst, msg...)
}

// DecodeWireError decodes what EncodeWireError wrote. Errors wrap
// ErrCorrupt; the lengths must account for b exactly. The strings are
// copies: b is not retained.
func DecodeWireError(b []byte) (WireError, error) {
	if len(b) < 2 {
		return WireError{}, corruptf("wire error: %d bytes, want at least 6", len(b))
	}
	n := int(binary.LittleEndian.Uint16(b))
	b = b[2:]
	if n > len(b) {
		return WireError{}, corruptf("wire error: code length %d exceeds %d remaining bytes", n, len(b))
	}
	code, b := b[:n], b[n:]
	if len(b) < 4 {
		return WireError{}, corruptf("wire error: message length truncated")
	}
	m := uint64(binary.LittleEndian.Uint32(b))
	b = b[4:]
	if m != uint64(len(b)) {
		return WireError{}, corruptf("wire error: message length %d, but %d bytes remain", m, len(b))
	}
	return WireError{Code: string(code), Message: string(b)}, nil
}

// truncateRunes cuts s to at most limit bytes without splitting a rune.
func truncateRunes(s string, limit uint64) string {
	if uint64(len(s)) <= limit {
		return s
	}
	n := int(limit)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
