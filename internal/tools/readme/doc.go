// Package readme holds the test (build tag e2e, run by make e2e) that runs
// every command of the repository's README as written, in a copy of the
// working tree. It has no code of its own.
package readme
