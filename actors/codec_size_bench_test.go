package actors

import (
	"context"
	"testing"
)

var benchEncode = Define("test.bench.encode", func(_ context.Context, x int64) (int64, error) { return x, nil }, Options{})

// The input encoding of a process-lane call: AppendInput (the task's limiter, found once)
// against AppendMax (the codec's interfaces looked up at every call).
func BenchmarkEncodeInput(b *testing.B) {
	buf := make([]byte, 0, 64)
	b.Run("AppendInput", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			buf, _ = benchEncode.AppendInput(buf[:0], int64(i), 1<<20)
		}
	})
	b.Run("AppendMax", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			buf, _ = AppendMax(benchEncode.InCodec, buf[:0], int64(i), 1<<20)
		}
	})
}
