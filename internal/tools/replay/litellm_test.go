package replay

import (
	"bytes"
	"context"
	"testing"
)

// The LiteLLM replay (real HTTP, at a small scale): through lanes-exporter
// at its defaults the backend never has more calls at work than the lane's
// limit, whatever the callers abandon; the report's table renders.
func TestLiteLLMReplay(t *testing.T) {
	runs, err := RunLiteLLM(context.Background(), 0.02)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 {
		t.Fatalf("%d runs, want 3", len(runs))
	}
	var b bytes.Buffer
	liteTable(&b, runs)
	t.Log("\n" + b.String())
	if def := runs[2]; def.Peak > def.Limit {
		t.Fatalf("%s: the backend had %d calls at work at once, want at most %d", def.Name, def.Peak, def.Limit)
	}
	if runs[0].Peak <= runs[0].Limit {
		t.Fatalf("no lane: the backend's peak %d, want above %d (the callers all at once)", runs[0].Peak, runs[0].Limit)
	}
}
