//go:build !race

package exporter

// raceSlowdown scales the time bounds of tests that measure a whole
// operation: 1 without the race detector.
const raceSlowdown = 1
