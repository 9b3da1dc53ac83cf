package limiter

import (
	"reflect"
	"testing"
)

// A lane is a small core whose parts each do one job (docs/DESIGN.md, "The
// lane's parts"): at most 12 fields, so that a new capability gets a part
// of its own rather than more fields on the hub.
func TestLaneIsSmall(t *testing.T) {
	if n := reflect.TypeOf(lane{}).NumField(); n > 12 {
		t.Fatalf("lane has %d fields, want at most 12: give the new job a part of its own", n)
	}
}
