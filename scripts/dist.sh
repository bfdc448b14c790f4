#!/bin/sh
# make dist: the busyguard CLI for each platform as an archive (the binary, LICENSE, README.md)
# with its SHA-256, and a krew plugin manifest over them all, in target/dist/ (DIST_DIR), so an
# operator's laptop needs no Rust:
#
#   kubectl krew install --manifest=target/dist/busyguard.yaml --archive=target/dist/busyguard-VERSION-TRIPLE.tar.gz
#
#   scripts/dist.sh [TRIPLE...]             release builds for these Rust targets (default: this machine's);
#                                           each needs its standard library (rustup target add TRIPLE) and a linker;
#                                           x86_64-unknown-linux-musl runs on any Linux (a glibc build needs
#                                           the builder's glibc or newer)
#   scripts/dist.sh --package TRIPLE BINARY an already built binary for TRIPLE, packaged alone
#   scripts/dist.sh --chart                 the Helm chart alone
#
# The Helm chart (charts/busyguard) is packaged beside them: busyguard-VERSION.tgz with its SHA-256,
# and the chart repository's index.yaml (`helm repo add busyguard DIST_URL`).
#
# DIST_URL is where the archives will be downloaded from, for the manifest's `uri`s (DIST_HOMEPAGE,
# the project's page, defaults to it).
set -eu
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
DIST_DIR=${DIST_DIR:-target/dist}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
DIST_URL=${DIST_URL:-https://downloads.example.com/busyguard/v$VERSION}

# krew's os and arch for a Rust target triple.
platform() {
	case $1 in
	x86_64-*-linux-*) echo linux amd64 ;;
	aarch64-*-linux-*) echo linux arm64 ;;
	x86_64-apple-darwin) echo darwin amd64 ;;
	aarch64-apple-darwin) echo darwin arm64 ;;
	x86_64-pc-windows-*) echo windows amd64 ;;
	*) echo "dist: no krew platform for the target $1" >&2; exit 2 ;;
	esac
}

# The binary's file name on the platform of a Rust target triple.
binary() {
	case $1 in *-windows-*) echo busyguard.exe ;; *) echo busyguard ;; esac
}

# target/dist/busyguard-VERSION-TRIPLE.tar.gz and its .sha256, from BINARY.
package() {
	triple=$1 built=$2
	platform "$triple" >/dev/null
	name=busyguard-$VERSION-$triple
	stage=$DIST_DIR/$name
	rm -rf "$stage" && mkdir -p "$stage"
	exe=$(binary "$triple")
	cp "$built" "$stage/$exe"
	cp LICENSE README.md "$stage/"
	tar -C "$stage" -czf "$DIST_DIR/$name.tar.gz" "$exe" LICENSE README.md
	rm -rf "$stage"
	(cd "$DIST_DIR" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
	echo "dist: $DIST_DIR/$name.tar.gz"
}

# target/dist/busyguard.yaml: the krew plugin manifest of every archive of this version there.
manifest() {
	out=$DIST_DIR/busyguard.yaml
	cat >"$out" <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: busyguard
spec:
  version: v$VERSION
  homepage: ${DIST_HOMEPAGE:-$DIST_URL}
  shortDescription: Status, checks and cleanup of busyguard, which keeps busy pods alive
  description: |
    busyguard keeps pods that are busy with a task alive through scale-downs, drains and
    consolidation. This plugin reports which pods it protects and why (status), checks that the
    API server reaches it (check), and undoes what it left after an uninstall (cleanup).
  platforms:
YAML
	for archive in "$DIST_DIR"/busyguard-"$VERSION"-*.tar.gz; do
		[ -e "$archive" ] || { echo "dist: no archive of $VERSION in $DIST_DIR" >&2; exit 2; }
		file=${archive##*/}
		triple=${file#busyguard-"$VERSION"-}
		triple=${triple%.tar.gz}
		set -- $(platform "$triple")
		exe=$(binary "$triple")
		cat >>"$out" <<YAML
  - selector:
      matchLabels:
        os: $1
        arch: $2
    uri: $DIST_URL/$file
    sha256: $(cut -d ' ' -f 1 "$archive.sha256")
    files:
    - from: $exe
      to: .
    - from: LICENSE
      to: .
    bin: $exe
YAML
	done
	echo "dist: $out"
}

# target/dist/busyguard-VERSION.tgz, its SHA-256 and index.yaml: the chart, through Helm's own
# library (scripts/helm-python.sh installs it under target/).
chart() {
	python_path=$(scripts/helm-python.sh)
	PYTHONPATH=$python_path python3 scripts/chart.py package "$DIST_DIR" "$DIST_URL"
	(cd "$DIST_DIR" && sha256sum "busyguard-$VERSION.tgz" >"busyguard-$VERSION.tgz.sha256")
	echo "dist: $DIST_DIR/busyguard-$VERSION.tgz"
}

mkdir -p "$DIST_DIR"
if [ "${1:-}" = --chart ]; then
	chart
	exit 0
fi
if [ "${1:-}" = --package ]; then
	[ $# -eq 3 ] || { echo 'usage: scripts/dist.sh --package TRIPLE BINARY' >&2; exit 2; }
	package "$2" "$3"
else
	[ $# -gt 0 ] || set -- "$(rustc -vV | sed -n 's/^host: //p')"
	for triple in "$@"; do
		platform "$triple" >/dev/null
		$CARGO build --release --locked --bin busyguard --target "$triple"
		package "$triple" "target/$triple/release/$(binary "$triple")"
	done
fi
manifest
chart
