package actors

import (
	"testing"
	"time"
)

type benchStruct struct {
	ID     int64
	Name   string
	Score  float64
	Tags   []string
	Counts map[string]int
	When   time.Time
}

func BenchmarkCodec(b *testing.B) {
	b.Run("int64", func(b *testing.B) { benchCodec(b, int64(-123456789)) })
	b.Run("bytes-1KiB", func(b *testing.B) { benchCodec(b, sized(1024)) })
	b.Run("cbor-struct", func(b *testing.B) {
		benchCodec(b, benchStruct{
			ID: 42, Name: "benchmark", Score: 0.75, Tags: []string{"a", "bb", "ccc"},
			Counts: map[string]int{"x": 1, "y": 2}, When: time.Unix(1700000000, 5).UTC(),
		})
	})
	// What the limits cost: a recursive type is walked before each encode (cycles,
	// depth), a slice of large elements is measured before each decode and after each
	// encode (memory budget).
	b.Run("cbor-list-30", func(b *testing.B) { benchCodec(b, chain(30)) })
	b.Run("cbor-any", func(b *testing.B) { benchCodec[any](b, []any{"a", uint64(1), map[any]any{"k": []any{1.5}}}) })
	b.Run("cbor-large-elems", func(b *testing.B) { benchCodec(b, make([][64]int64, 16)) })
}

// benchCodec measures one Append into a reused buffer plus one Decode.
func benchCodec[T any](b *testing.B, v T) {
	c, err := CodecFor[T]()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf, err = c.Append(buf[:0], v)
		if err != nil {
			b.Fatal(err)
		}
		if _, err = c.Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}
