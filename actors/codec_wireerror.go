package actors

import (
	"encoding/binary"
	"math"
	"unicode/utf8"
)

// WireError carries a task error across processes: its message, a code string if the error
// has one, and, for a panic, the lane's stack.
type WireError struct {
	Code    string
	Message string
	Stack   string // the panicking goroutine's stack (panics only); never part of Error()
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

// EncodeWireStack appends a wire error with a stack: the form of EncodeWireError followed,
// when stack is not empty, by a u32 stack length and the stack.
func EncodeWireStack(dst []byte, code, msg string, stack []byte) []byte {
	dst = EncodeWireError(dst, code, msg)
	if len(stack) == 0 {
		return dst
	}
	if uint64(len(stack)) > math.MaxUint32 {
		stack = stack[:math.MaxUint32]
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(stack)))
	return append(dst, stack...)
}

// DecodeWireError decodes what EncodeWireError and EncodeWireStack wrote.
// Errors wrap ErrCorrupt; the lengths must account for b exactly, and a stack
// section, if present, must not be empty. The strings are copies: b is not
// retained.
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
	if m > uint64(len(b)) {
		return WireError{}, corruptf("wire error: message length %d, but %d bytes remain", m, len(b))
	}
	msg, b := b[:m], b[m:]
	var stack []byte
	if len(b) > 0 {
		if len(b) < 4 {
			return WireError{}, corruptf("wire error: %d bytes after the message", len(b))
		}
		s := uint64(binary.LittleEndian.Uint32(b))
		b = b[4:]
		if s == 0 || s != uint64(len(b)) {
			return WireError{}, corruptf("wire error: stack length %d, but %d bytes remain", s, len(b))
		}
		stack = b
	}
	return WireError{Code: string(code), Message: string(msg), Stack: string(stack)}, nil
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

// FitWireError appends we to dst in at most limit bytes when it can: the stack is cut
// first, then the message (at rune boundaries). A code too long for limit is sent whole,
// so the result may still exceed limit.
func FitWireError(dst []byte, we WireError, limit int) []byte {
	head := 2 + len(truncateRunes(we.Code, math.MaxUint16)) + 4
	room := limit - head - len(we.Message)
	switch {
	case we.Stack != "" && room > 4:
		return EncodeWireStack(dst, we.Code, we.Message, []byte(truncateRunes(we.Stack, uint64(room-4))))
	case room >= 0:
		return EncodeWireError(dst, we.Code, we.Message)
	}
	return EncodeWireError(dst, we.Code, truncateRunes(we.Message, uint64(max(limit-head, 0))))
}
