//go:build race

package exporter

// raceSlowdown scales the time bounds of tests that measure a whole
// operation (a scrape, say): the race detector makes code several times
// slower.
const raceSlowdown = 8
