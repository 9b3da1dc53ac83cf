package classify

import "time"

// Report is the classification route's answer for every lane: this
// process's, then its targets' (marked with "target"). With the limiter
// off it is {"version": 1, "enabled": false}.
type Report struct {
	Version     int              `json:"version"`
	Enabled     bool             `json:"enabled"`
	GeneratedAt time.Time        `json:"generated_at,omitzero"`
	Thresholds  *ThresholdsJSON  `json:"thresholds,omitempty"`
	Lanes       []Classification `json:"lanes,omitzero"` // [] rather than absent when enabled
	Targets     []TargetStatus   `json:"targets,omitempty"`
}

// TargetStatus reports the last poll of a target (another process's
// snapshot).
type TargetStatus struct {
	Name  string `json:"name"`
	Up    bool   `json:"up"`
	Error string `json:"error,omitempty"`
}

// ThresholdsJSON shows the thresholds in force, with times in seconds.
type ThresholdsJSON struct {
	WaitP90S       float64 `json:"wait_p90_s"`
	UpstreamErrors int     `json:"upstream_errors"`
	ErrorRatio     float64 `json:"error_ratio"`
	Retries        int     `json:"retries"`
	ClearAfterS    float64 `json:"clear_after_s"`
}

// JSON returns the thresholds as the payload shows them.
func (t Thresholds) JSON() *ThresholdsJSON {
	return &ThresholdsJSON{WaitP90S: t.WaitP90.Seconds(), UpstreamErrors: t.UpstreamErrors, ErrorRatio: t.ErrorRatio, Retries: t.Retries, ClearAfterS: t.ClearAfter.Seconds()}
}

// ErrorBody is the answer to a lookup that finds nothing (404) or a bad
// query (400).
type ErrorBody struct {
	Version int    `json:"version"`
	Error   string `json:"error"`
}
