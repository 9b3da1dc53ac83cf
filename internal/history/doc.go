// Package history keeps the last minutes of each lane's figures for the
// status page: one sample per lane at each Record (every 2 s in
// lanes-exporter), at most a window's worth per lane, in a ring that
// overwrites the oldest. A lane that a Record leaves out (the limiter
// forgot it: lane_idle_ttl) loses its history at once, so the history's
// size is bounded by the lanes' (limits.max_lanes) times the window.
//
// A History is safe for concurrent use.
package history
