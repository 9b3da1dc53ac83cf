// Package hygiene holds the repository's own checks, as tests: no built
// binary is tracked, every binary go build leaves is ignored, and no code
// outside tests imports package testing.
package hygiene
