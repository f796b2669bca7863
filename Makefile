# fencer's build, test and benchmark entry points. See README.md.

GO        ?= go
PKGS      ?= ./...
FUZZTIME  ?= 10s
BENCHTIME ?= 1x

.PHONY: all run build test bench lint fuzz kube-apiserver clean

all: lint test

## run: start fencer (the live fencing demo on an embedded etcd)
run:
	$(GO) run ./cmd/fencer demo

## build: build the fencer binary into bin/
build:
	$(GO) build -o bin/fencer ./cmd/fencer

## kube-apiserver: build the test kube-apiserver into .cache/bin (cached)
kube-apiserver:
	./scripts/build-kube-apiserver.sh

## test: lint, build the test kube-apiserver, run every test with the race detector
test: lint kube-apiserver
	FENCER_REQUIRE_KUBE=1 $(GO) test -race -count=1 -timeout 20m $(PKGS)

## bench: run the benchmarks and print their figures
bench: kube-apiserver
	./scripts/bench.sh

## lint: gofmt and go vet
lint:
	@out="$$(gofmt -l $$(git ls-files '*.go' | grep -v '^tools/') 2>&1)"; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

## fuzz: run every fuzz target for FUZZTIME each
fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

clean:
	rm -rf bin .cache
