package replay

import (
	"testing"
	"time"
)

// Jitter alone never cuts the limit: on gateways whose first byte does not
// grow with load (uniform in [300, 400) ms; 50 or 90 ms, equally likely),
// with 12 clients and a ceiling of 8, the limit reaches 8 within 60 s and
// stays there to the end, for every seed tried. (Before a lane has seen 8
// pairs of first bytes it does not know its gateway's jitter, and a cut it
// makes then is taken back once it does: seconds, logged.)
func TestJitterDoesNotCut(t *testing.T) {
	for _, g := range jitterGateways {
		t.Run(g.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 10; seed++ {
				r, err := Run("lanes", Jittery(seed, g.first, g.jitter, g.bimodal))
				if err != nil {
					t.Fatal(err)
				}
				settled, first := r.Settled(8)
				t.Logf("seed %d: at 8 for good after %s (first at 8 after %s); %d calls completed", seed, settledText(settled), settledText(first), r.completed())
				if settled < 0 || settled > time.Minute {
					t.Fatalf("seed %d: the limit settled at 8 after %s, want within 60 s", seed, settledText(settled))
				}
			}
		})
	}
}
