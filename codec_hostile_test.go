package knit_test

import (
	"context"
	"testing"

	"github.com/knitgo/knit"
)

var (
	bigResult = knit.Define("test.codec.big", func(_ context.Context, n int) ([]byte, error) {
		return make([]byte, n), nil
	})
)

func TestCodecResultTooLarge(t *testing.T) {
	p := newProcessPool(t, knit.Config{Lanes: 1, Payload: knit.Payload{Arena: 64 << 10}}, bigResult, add)
	_, err := bigResult.Call(context.Background(), p, 64<<10)
	t.Logf("err=%v", err)
	_, err = bigResult.Call(context.Background(), p, 128<<10)
	t.Logf("err=%v", err)
	s, err := add.Call(context.Background(), p, [2]int64{1, 2})
	t.Logf("add=%v %v %+v", s, err, p.Stats().Lanes)
}
