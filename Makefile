# The two commands the README opens with: `make demo` and `make test`.
GO ?= go

.PHONY: demo test stress chaos e2e fuzz tools fmt-check vet lint-observability bench replay

## demo: lanes-exporter against a built-in simulated gateway and load; prints the URLs
demo:
	$(GO) run ./cmd/lanes-exporter --demo

## test: every test: gofmt check, go vet, go test -race (the fuzz targets' seed corpora
## run as ordinary tests)
test: tools fmt-check vet lint-observability
	$(GO) test -race -count=1 -parallel 6 $(SLOWFIRST) ./...

# The packages whose tests take longest, named first: go test starts the
# packages' runs in the order it is given them, two at a time on two CPUs,
# and ./... alone would start sharedlane (the longest) last, so that it ran
# on after the others had finished. Longest first is the shorter schedule.
SLOWFIRST = ./sharedlane ./internal/exporter ./internal/tools/replay ./limiter

## lint-observability: Grafana's dashboard-linter (--strict) on the generated dashboards and
## pint on the alert rules, from PATH or ../shared/tools/; says plainly when they are missing
lint-observability:
	@sh internal/tools/obslint/lint.sh

## stress: the race-enabled suite STRESSCOUNT times over (-count=3), two copies at
## once, so that a test that passes alone and fails under load shows; fails if either
## copy fails, and prints the failures and where the logs are (about 30 min here)
STRESSCOUNT ?= 3
stress: tools
	@dir=$$(mktemp -d); echo "make stress: two copies of go test -race -count=$(STRESSCOUNT) ./..., logs in $$dir"; \
	for i in 1 2; do ( $(GO) test -race -count=$(STRESSCOUNT) -parallel 6 -timeout 60m $(SLOWFIRST) ./... > $$dir/copy$$i.log 2>&1; echo $$? > $$dir/copy$$i.rc ) & done; wait; \
	fail=0; for i in 1 2; do \
	  if [ "$$(cat $$dir/copy$$i.rc)" != 0 ]; then fail=1; echo "copy $$i failed:"; grep -E -e '^(--- FAIL|FAIL|panic:)' -e '_test.go:[0-9]+:' $$dir/copy$$i.log | head -40; fi; \
	done; \
	[ $$fail = 0 ] && echo "make stress: both copies passed"; exit $$fail

## chaos: Redis restarted under load CHAOSRESTARTS times of each kind (empty, and from a
## snapshot older than a lease), two lanes-exporter processes sharing a lane: never more
## calls at the gateway than the lane's limit, no call cut (about 13 minutes; make test
## runs 3 of each)
CHAOSRESTARTS ?= 100
chaos: tools
	LLMLANES_CHAOS_RESTARTS=$(CHAOSRESTARTS) $(GO) test -count=1 -timeout 60m -run '^TestRestartChaos$$' -v ./sharedlane

## fuzz: coverage-guided fuzzing of each fuzz target for FUZZTIME (CI runs 10s each)
FUZZTIME ?= 2m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzModelOf$$' -fuzztime $(FUZZTIME) ./limiter/lanehttp
	$(GO) test -run '^$$' -fuzz '^FuzzEstimateTokens$$' -fuzztime $(FUZZTIME) ./limiter/lanehttp
	$(GO) test -run '^$$' -fuzz '^FuzzRateLimits$$' -fuzztime $(FUZZTIME) ./limiter/lanehttp
	$(GO) test -run '^$$' -fuzz '^FuzzUsage$$' -fuzztime $(FUZZTIME) ./limiter/lanehttp
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./internal/exporter

NODE_SDK = internal/exporter/testdata/node-sdk

## tools: what the tests need beyond Go, installed when missing (apt-get needs root, as
## in CI): promtool, from Debian's prometheus package; redis-server and redis-cli, from
## Debian's redis-server package, for the shared lanes; haproxy, Debian's, which the
## proxy is measured beside (make bench, and a short run in the tests); Node.js and the
## official OpenAI and Anthropic Node SDKs (pinned in $(NODE_SDK)/package-lock.json) for the proxy's
## retry and client tests
tools:
	@command -v promtool >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }
	@command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm; }
	@command -v redis-server >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server; }
	@command -v haproxy >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy; }
	@test -d $(NODE_SDK)/node_modules/openai -a -d $(NODE_SDK)/node_modules/@anthropic-ai/sdk || npm ci --prefix $(NODE_SDK) --no-audit --no-fund --loglevel=error

## e2e: end-to-end tests that need software beyond Go: the status page in Debian's
## chromium, and a real Prometheus (Debian's) scraping the exporter, loading the rules
## and running every dashboard query; installs them when missing (needs root, as in CI).
## CI runs it after make test; the status page's screenshot is left in artifacts/.
e2e: tools
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	@mkdir -p artifacts
	STATUS_SCREENSHOT=$(CURDIR)/artifacts/status-page.png $(GO) test -tags e2e -count=1 -timeout 15m -run 'Browser|Prometheus|EveryState|Readme' ./internal/exporter ./internal/demo ./internal/tools/readme

fmt-check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

## bench: run the benchmarks, then lanes-exporter beside HAProxy and no limiter, per call and
## under overload (internal/tools/proxybench, each part in its own process, about 12
## minutes), and rewrite docs/BENCHMARKS.md with
## figures and ratios (the raw go test output is kept in docs/bench/raw.txt, the proxy
## figures in docs/bench/proxy.json; re-render both with
##  go run ./internal/tools/benchreport -in docs/bench/raw.txt)
bench: tools
	$(GO) run ./internal/tools/benchreport $(BENCHFLAGS) -out docs/BENCHMARKS.md 2> docs/bench/raw.txt

## replay: regenerate docs/INCIDENT-REPLAY.md, docs/ADAPTIVE.md and their charts (the simulated replays are
## exact; -http adds the real-HTTP replay, about 30 s)
replay:
	$(GO) run ./examples/incident-replay -out docs -http
