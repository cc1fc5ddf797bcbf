# sluice: every command the README and CI use lives here.
GO        ?= go
BUILD     := build
WASM      := $(BUILD)/sluice.wasm
GOTESTFLAGS ?= -race -count=1 -timeout 30m

.PHONY: all wasm build test bench check fmt vet tidy clean

all: build

## wasm: the proxy-wasm filter, built with the standard Go toolchain as a WASI reactor.
wasm: $(BUILD)
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $(WASM) ./filter

## build: the filter and every binary.
build: wasm
	@if [ -d controlplane/cmd/sluice-controlplane ]; then \
		$(GO) build -trimpath -o $(BUILD)/sluice-controlplane ./controlplane/cmd/sluice-controlplane; fi
	@if [ -d testenv/cmd/sluice-devproxy ]; then \
		$(GO) build -trimpath -o $(BUILD)/sluice-devproxy ./testenv/cmd/sluice-devproxy; fi

## test: build what the tests need, then run every test (race detector on native code).
test: build
	$(GO) test $(GOTESTFLAGS) ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./filter/... ./shared/...

## bench: the benchmarks named in the issues' "Measure" sections.
bench: wasm
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./...

## check: formatting, vet (native and wasip1) and a tidy go.mod; fails if anything would change.
check:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./filter/... ./shared/...
	$(GO) mod tidy -diff

$(BUILD):
	mkdir -p $(BUILD)

clean:
	rm -rf $(BUILD)
