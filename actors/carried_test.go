package actors

import (
	"errors"
	"strings"
	"testing"
)

func TestCarriedRoundTrip(t *testing.T) {
	in := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "": "", "k": strings.Repeat("v", 300)}
	rec := AppendCarried([]byte("x"), func(add func(k, v string)) {
		for k, v := range in {
			add(k, v)
		}
	})
	rec = append(rec, "value"...)
	fields, rest, err := SplitCarried(rec[1:])
	if err != nil || string(rest) != "value" {
		t.Fatalf("split: %q, %v", rest, err)
	}
	got := map[string]string{}
	if err := EachCarried(fields, func(k, v string) { got[k] = v }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(in) {
		t.Fatalf("got %d fields, want %d", len(got), len(in))
	}
	for k, v := range in {
		if got[k] != v {
			t.Fatalf("field %q = %q, want %q", k, got[k], v)
		}
	}
}

// Fields past MaxCarried are left out whole; what is kept still parses.
func TestCarriedBound(t *testing.T) {
	rec := AppendCarried(nil, func(add func(k, v string)) {
		for range 10 {
			add("key", strings.Repeat("v", 1000))
		}
	})
	fields, rest, err := SplitCarried(rec)
	if err != nil || len(rest) != 0 || len(fields) > MaxCarried {
		t.Fatalf("split: %d fields bytes, %d rest, %v", len(fields), len(rest), err)
	}
	n := 0
	if err := EachCarried(fields, func(string, string) { n++ }); err != nil || n != 4 {
		t.Fatalf("%d fields kept, %v; want 4", n, err)
	}
}

func FuzzCarried(f *testing.F) {
	f.Add(AppendCarried(nil, func(add func(k, v string)) { add("a", "b") }))
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Add([]byte{0x83, 0x00, 0x05, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		fields, rest, err := SplitCarried(b)
		if err != nil {
			if !errors.Is(err, ErrCarried) {
				t.Fatalf("error %v does not wrap ErrCarried", err)
			}
			return
		}
		if len(fields)+len(rest) > len(b) {
			t.Fatal("split grew the input")
		}
		if err := EachCarried(fields, func(string, string) {}); err != nil && !errors.Is(err, ErrCarried) {
			t.Fatalf("error %v does not wrap ErrCarried", err)
		}
	})
}
