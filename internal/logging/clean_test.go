package logging

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain text", "plain text"},
		{"tab\there", "tab here"},
		{"two\nlines\r", `two\nlines\r`},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"bad \xff byte", `bad \xff byte`},
		{"bidi \u202eevil", `bidi \u202eevil`},
		{"nul\x00", `nul\x00`},
		{"ünïcödé ✓", "ünïcödé ✓"},
	}
	for _, c := range cases {
		if got := Clean(c.in, 100); got != c.want {
			t.Errorf("Clean(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	long := strings.Repeat("é", 100)
	got := Clean(long, 41)
	if len(got) > 41 || !strings.HasSuffix(got, "…") || !utf8.ValidString(got) {
		t.Errorf("Clean(long, 41) = %q (%d bytes)", got, len(got))
	}
	if got := Clean(strings.Repeat("a", 40), 40); got != strings.Repeat("a", 40) {
		t.Errorf("a text of exactly max bytes was cut: %q", got)
	}
}

func FuzzClean(f *testing.F) {
	f.Add("hello\n\x1b[2J\xff\u202e", 32)
	f.Fuzz(func(t *testing.T, s string, max int) {
		max = max % 4096
		got := Clean(s, max)
		if len(got) > maxInt(max, 16) {
			t.Fatalf("Clean(%q, %d) is %d bytes", s, max, len(got))
		}
		if !utf8.ValidString(got) {
			t.Fatalf("Clean(%q) = %q is not UTF-8", s, got)
		}
		for _, r := range got {
			if !unicode.IsPrint(r) {
				t.Fatalf("Clean(%q) = %q keeps %U", s, got, r)
			}
		}
	})
}
