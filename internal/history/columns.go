package history

import (
	"math"

	"github.com/llmlanes/llmlanes/classify"
)

// Columns is a lane's samples as the history route sends them: one array
// a figure, index i of each being the i-th sample, so that 450 samples
// are a few KiB of JSON.
type Columns struct {
	Lane          string     `json:"lane"`
	At            []int64    `json:"t"` // Unix milliseconds
	Inflight      []int32    `json:"inflight"`
	Limit         []int32    `json:"limit"`
	Interactive   []int32    `json:"queued_interactive"`
	Default       []int32    `json:"queued_default"`
	Bulk          []int32    `json:"queued_bulk"`
	WaitP90       []*float32 `json:"wait_p90_s"` // null: no wait ended in the 5 minutes
	QueueTimeouts []int32    `json:"queue_timeouts_5m"`
	Upstream      []int32    `json:"upstream_errors_5m"`
	State         []int      `json:"state"` // indexes into Page.States (ints: a []uint8 would be base64)
}

// Page is what the history route answers.
type Page struct {
	IntervalS float64          `json:"interval_s"`
	WindowS   float64          `json:"window_s"`
	States    []classify.State `json:"states"`
	Lanes     []Columns        `json:"lanes"`
}

// ColumnsOf turns series into columns.
func ColumnsOf(series []Series) []Columns {
	out := make([]Columns, 0, len(series))
	for _, s := range series {
		n := len(s.Samples)
		c := Columns{Lane: s.Lane, At: make([]int64, n), Inflight: make([]int32, n), Limit: make([]int32, n),
			Interactive: make([]int32, n), Default: make([]int32, n), Bulk: make([]int32, n), WaitP90: make([]*float32, n),
			QueueTimeouts: make([]int32, n), Upstream: make([]int32, n), State: make([]int, n)}
		for i, x := range s.Samples {
			c.At[i], c.Inflight[i], c.Limit[i] = x.At, x.Inflight, x.Limit
			c.Interactive[i], c.Default[i], c.Bulk[i] = x.Interactive, x.Default, x.Bulk
			if !math.IsNaN(float64(x.WaitP90)) {
				w := x.WaitP90
				c.WaitP90[i] = &w
			}
			c.QueueTimeouts[i], c.Upstream[i], c.State[i] = x.QueueTimeouts, x.UpstreamErrors, int(x.State)
		}
		out = append(out, c)
	}
	return out
}
