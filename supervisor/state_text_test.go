package supervisor

import (
	"encoding/json"
	"testing"
)

func TestStateText(t *testing.T) {
	for s := range State(len(stateNames) + 2) {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if want := `"` + s.String() + `"`; string(b) != want {
			t.Errorf("%d marshals as %s, want %s", s, b, want)
		}
		var back State
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Errorf("%s unmarshals as %d, %v", b, back, err)
		}
	}
	var s State
	if err := json.Unmarshal([]byte(`"sleeping"`), &s); err == nil {
		t.Error("an unknown state name unmarshals")
	}
}
