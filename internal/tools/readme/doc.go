// Package readme holds the tests of the repository's README: that its Go
// quick start compiles (make test), and (build tag e2e, run by make e2e)
// that every command of it runs as written, in a copy of the working tree.
// It has no code of its own.
package readme
