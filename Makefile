# sluice: every command the README and CI use lives here.
GO        ?= go
BUILD     := build
WASM      := $(BUILD)/sluice.wasm
GOTESTFLAGS ?= -race -count=1 -timeout 30m

.PHONY: all wasm build run test bench check lint clean

all: build

## wasm: the proxy-wasm filter, built with the standard Go toolchain as a WASI reactor.
wasm:
	@mkdir -p $(BUILD)
	@echo "==> building $(WASM)"
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $(WASM) ./filter

## build: the filter and every binary.
build: wasm
	@echo "==> building $(BUILD)/sluice-controlplane"
	$(GO) build -trimpath -o $(BUILD)/sluice-controlplane ./controlplane/cmd/sluice-controlplane
	@for cmd in sluice-devproxy sluice-echo sluice-run; do \
		echo "==> building $(BUILD)/$$cmd"; \
		$(GO) build -trimpath -o $(BUILD)/$$cmd ./testenv/cmd/$$cmd || exit 1; done

## run: build, then start the control plane (127.0.0.1:$(CP_PORT)), the demo upstream
## ($(UPSTREAM_PORT)) and two dev proxies ($(PROXY_PORT), $(PROXY2_PORT)) with the demo policy; Ctrl-C stops all.
## Redis instead of the embedded store: make run REDIS_URL=redis://127.0.0.1:6379
CP_PORT       ?= 8080
PROXY_PORT    ?= 10000
PROXY2_PORT   ?= 10001
UPSTREAM_PORT ?= 8000
RUN_DIR       ?= $(BUILD)/run
run: build
	@CP_PORT=$(CP_PORT) PROXY_PORT=$(PROXY_PORT) PROXY2_PORT=$(PROXY2_PORT) UPSTREAM_PORT=$(UPSTREAM_PORT) RUN_DIR=$(RUN_DIR) REDIS_URL=$(REDIS_URL) \
		BIN_DIR=$(BUILD) $(BUILD)/sluice-run

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

## lint: staticcheck, natively and for the filter's wasip1 target. Its version is pinned by
## the tool directive in go.mod, so every machine runs the same one (v0.6.x: the last
## release whose go.mod allows Go 1.24). The wasip1 pass leaves out U1000 (unused code):
## this release does not count a //go:wasmexport function as used, so it would flag every
## export and what it calls; the native pass still checks U1000 everywhere.
lint:
	@mkdir -p $(BUILD)
	$(GO) build -o $(BUILD)/staticcheck honnef.co/go/tools/cmd/staticcheck
	$(BUILD)/staticcheck ./...
	GOOS=wasip1 GOARCH=wasm $(BUILD)/staticcheck -checks inherit,-U1000 ./filter/... ./shared/...

clean:
	rm -rf $(BUILD)
