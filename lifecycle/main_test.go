package lifecycle

import (
	"testing"

	"go.uber.org/goleak"
)

// Output relays, child waiters, hand-overs and spares all start goroutines: none may outlive
// the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
