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
