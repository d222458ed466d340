package shm

import (
	"strings"
	"testing"
	"unsafe"
)

func TestHeapAligned(t *testing.T) {
	for _, size := range []int{0, 1, 7, 63, 64, 65, 4096, 1<<20 + 3} {
		b := Heap(size)
		if len(b) != size || cap(b) != size {
			t.Fatalf("Heap(%d): len %d cap %d", size, len(b), cap(b))
		}
		if size == 0 {
			continue
		}
		if p := uintptr(unsafe.Pointer(&b[0])); p%64 != 0 {
			t.Fatalf("Heap(%d) at %#x: not 64-byte aligned", size, p)
		}
		for i, c := range b {
			if c != 0 {
				t.Fatalf("Heap(%d)[%d] = %d, want 0", size, i, c)
			}
		}
	}
}

func TestViews(t *testing.T) {
	b := Heap(64)
	U32(b, 4).Store(0x01020304)
	U64(b, 8).Store(1<<40 + 5)
	I64(b, 56).Add(-3)
	if got := U32(b, 4).Load(); got != 0x01020304 {
		t.Fatalf("U32 = %#x", got)
	}
	if got := U64(b, 8).Load(); got != 1<<40+5 {
		t.Fatalf("U64 = %d", got)
	}
	if got := I64(b, 56).Load(); got != -3 {
		t.Fatalf("I64 = %d", got)
	}
	for i, c := range b[:4] {
		if c != 0 {
			t.Fatalf("U32 store spilled into byte %d", i)
		}
	}
}

func TestViewsPanic(t *testing.T) {
	b := Heap(64)
	cases := []struct {
		name, want string
		f          func()
	}{
		{"U32 misaligned", "not 4-byte aligned", func() { U32(b, 2) }},
		{"U64 misaligned", "not 8-byte aligned", func() { U64(b, 4) }},
		{"I64 misaligned", "not 8-byte aligned", func() { I64(b, 12) }},
		{"U32 past end", "out of range", func() { U32(b, 62) }},
		{"U64 past end", "out of range", func() { U64(b, 64) }},
		{"I64 negative", "out of range", func() { I64(b, -8) }},
		{"U32 empty", "out of range", func() { U32(nil, 0) }},
		{"Heap negative", "negative size", func() { Heap(-1) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				msg, _ := r.(string)
				if !strings.Contains(msg, c.want) {
					t.Fatalf("panic %v, want one containing %q", r, c.want)
				}
			}()
			c.f()
		})
	}
}
