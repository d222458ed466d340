package logging

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Clean makes text a lane chose — a line it wrote, a message it left in its region — safe to
// put in one log line or error message: printable UTF-8 only. A tab becomes a space; any
// other control character, format character (bidirectional overrides included) or byte that
// is not UTF-8 is written as an escape (\n, \x1b, \u202e), so a lane can neither break a log
// line in two nor send a terminal escape sequence. The result is at most max bytes (at
// least 16); a longer text is cut and ends with "…".
func Clean(s string, max int) string {
	max = maxInt(max, 16)
	clean := len(s) <= max
	for i := 0; clean && i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n <= 1 || !unicode.IsPrint(r) {
			clean = false
		}
		i += n
	}
	if clean {
		return s
	}
	const ellipsis = "…"
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		var piece string
		switch {
		case r == utf8.RuneError && n <= 1:
			piece = fmt.Sprintf(`\x%02x`, s[i])
		case r == '\t':
			piece = " "
		case r == '\n':
			piece = `\n`
		case r == '\r':
			piece = `\r`
		case unicode.IsPrint(r):
			piece = s[i : i+n]
		case r < 0x100:
			piece = fmt.Sprintf(`\x%02x`, r)
		default:
			piece = fmt.Sprintf(`\u%04x`, r)
		}
		if b.Len()+len(piece) > max-len(ellipsis) && (i+n < len(s) || b.Len()+len(piece) > max) {
			b.WriteString(ellipsis)
			break
		}
		b.WriteString(piece)
		i += n
	}
	return b.String()
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}
