# The two commands the README opens with: `make demo` and `make test`.
GO ?= go

.PHONY: demo test fmt-check vet bench

## demo: lanes-exporter against a built-in simulated gateway and load; prints the URLs
demo:
	$(GO) run ./cmd/lanes-exporter --demo

## test: every test: gofmt check, go vet, go test -race, short fuzz runs
test: fmt-check vet
	$(GO) test -race -count=1 ./...
	$(GO) test -run '^$$' -fuzz '^FuzzModelOf$$' -fuzztime 10s ./limiter/lanehttp
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime 10s ./internal/exporter

fmt-check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

## bench: run the benchmarks and rewrite docs/BENCHMARKS.md with figures and ratios
## (the raw go test output is kept in docs/bench/raw.txt; re-render it with
##  go run ./internal/benchreport -in docs/bench/raw.txt)
bench:
	$(GO) run ./internal/benchreport -out docs/BENCHMARKS.md 2> docs/bench/raw.txt
