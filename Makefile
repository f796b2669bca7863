# fencer's build, test and benchmark entry points. See README.md.

GO        ?= go
PKGS      ?= ./...
# The modules a gRPC user requires, each in its directory; the root module
# requires them through replace directives (internal/layout tests this).
LIGHT_MODULES := token proto client
# Every module but the root and tools/: the light modules, the three small
# internal ones the root and the Kubernetes module share, the Kubernetes
# module, the Sharder's end-to-end tests, and the multicluster-runtime
# Coordinator.
MODULES := $(LIGHT_MODULES) internal/mutant internal/freeport internal/rendezvous kubeadapter kubeadapter/shard/e2e mcr
FUZZTIME  ?= 10s
BENCHTIME ?= 1x

.PHONY: all run demo build release test bench chaos shardchaos mutants lint fuzz proto proto-lint proto-check python-deps kube-apiserver clean

all: lint test

# run and demo build the binary and run it, rather than `go run` it: on
# Ctrl-C, `go run` exits 1 whatever the program's status, and make then
# reports an error; fencer serve itself exits 0 after a clean shutdown.
# They and build echo no command, so that make demo prints what the
# README's demo block shows (TestDocs runs that block).

## run: start the fencer service on an embedded etcd (data in ./data, gRPC on 127.0.0.1:7890)
run: build
	@./bin/fencer serve

## demo: play a stale write being fenced, live on an embedded etcd
demo: build
	@./bin/fencer demo

## build: build the fencer binary into bin/
build:
	@$(GO) build -ldflags "-X main.commit=$$(git rev-parse HEAD 2>/dev/null)" -o bin/fencer ./cmd/fencer

## release: cut release VERSION (make release VERSION=v0.1.0): tag every module on one commit and build the binaries into dist/ (docs/releasing.md)
release:
	./scripts/release.sh "$(VERSION)"

## kube-apiserver: build the test kube-apiserver and its etcd into .cache/bin (cached)
kube-apiserver:
	./scripts/build-kube-apiserver.sh

## python-deps: install Debian's python3-grpcio, python3-protobuf, python3-venv and python3-wheel (for the Python client's tests and its install line)
python-deps:
	./scripts/install-python-deps.sh

## proto: regenerate the Go and Python code from proto/ (committed)
proto:
	./scripts/proto.sh

## proto-lint: buf lint of proto/ (STANDARD rules)
proto-lint:
	./scripts/proto-lint.sh

## proto-check: lint proto/ and fail if regenerating from it changes anything
proto-check: proto-lint proto
	@out="$$(git status --porcelain proto python)"; \
	if [ -n "$$out" ]; then echo "make proto changed generated code:"; echo "$$out"; git diff --stat proto python; exit 1; fi

## test: lint, build the test kube-apiserver and etcd, run every test of every module with the race detector, and check the alert rules and dashboard (tools/promcheck)
test: lint kube-apiserver python-deps
	./scripts/test.sh

## bench: run the benchmarks and print their figures
bench: kube-apiserver
	./scripts/bench.sh

## chaos: etcd chaos on a 3-member cluster of member processes, holders as processes, until CHAOS_WRITES writes of which CHAOS_LATE late, with the broken-guard control; prints the counts; then the mutant table, with the chaos test run under the mutants it must catch
CHAOS_WRITES ?= 20000
CHAOS_LATE   ?= 1000
chaos:
	$(GO) test -count=1 -timeout 60m -run '^TestChaosEtcdFencedRegister$$' -v ./integration -chaos.writes=$(CHAOS_WRITES) -chaos.late=$(CHAOS_LATE)
	$(GO) test -count=1 -timeout 30m -run '^TestMutantsAreCaught$$' -v ./integration -mutants.chaos

## mutants: run each deliberately wrong guard (internal/mutant, build tag fencer_mutants) against the tests that must catch it, and print the table
mutants: kube-apiserver
	FENCER_REQUIRE_KUBE=1 $(GO) test -race -count=1 -timeout 20m -run '^TestMutantsAreCaught$$' -v ./integration

## shardchaos: shard members as processes (SIGSTOP, partition, SIGKILL mid-write, restart) for SHARD_ROUNDS rounds; prints the counts
SHARD_ROUNDS ?= 5
shardchaos: kube-apiserver
	cd kubeadapter/shard/e2e && FENCER_REQUIRE_KUBE=1 $(GO) test -race -count=1 -timeout 30m -run '^TestShardProcesses$$' -v . -shard-process-rounds=$(SHARD_ROUNDS)

## lint: gofmt and go vet, in every module
lint:
	@out="$$(gofmt -l $$(git ls-files '*.go' | grep -v '^tools/') 2>&1)"; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

## fuzz: run every fuzz target for FUZZTIME each
fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

clean:
	rm -rf bin dist .cache
