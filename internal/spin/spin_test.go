package spin

import "testing"

func TestPauseReturns(t *testing.T) {
	for range 1000 {
		Pause()
	}
}

func BenchmarkPause(b *testing.B) {
	for range b.N {
		Pause()
	}
}
