# busyguard: `make run` serves on its defaults with dev certificates, `make test` runs every test.
CARGO ?= cargo
LISTEN ?= 127.0.0.1:8443
ADMIN_LISTEN ?= 127.0.0.1:8080

.PHONY: build run certs test bench lint fmt clean

build:
	$(CARGO) build --release --locked

# Dev certificates for localhost/127.0.0.1 are made once and kept while valid.
certs:
	$(CARGO) run --quiet --locked -- certs --dir certs

run: certs
	$(CARGO) run --quiet --locked -- serve --listen $(LISTEN) --admin-listen $(ADMIN_LISTEN)

test:
	$(CARGO) nextest run --locked --no-fail-fast

# Release build; prints result tables (see BENCHMARKS.md).
bench:
	$(CARGO) bench --locked --bench view_memory

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

fmt:
	$(CARGO) fmt

clean:
	$(CARGO) clean
