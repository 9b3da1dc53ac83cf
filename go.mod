module github.com/llmlanes/llmlanes

go 1.26.0

require (
	go.uber.org/goleak v1.3.0
	pgregory.net/rapid v1.3.0
)

require golang.org/x/sync v0.25.0
