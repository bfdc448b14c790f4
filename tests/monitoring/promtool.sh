#!/bin/sh
# Prints the path of a promtool for the alert tests (tests/project/monitoring.rs): the one on PATH,
# else Debian's prometheus package's, unpacked once into target/tools (no install, no service).
set -eu
if command -v promtool >/dev/null 2>&1; then command -v promtool; exit 0; fi
tools="$(cd "$(dirname "$0")/../.." && pwd)/target/tools"
if [ -x "$tools/promtool" ]; then echo "$tools/promtool"; exit 0; fi
command -v apt-get >/dev/null 2>&1 || { echo "no promtool: install Prometheus' promtool (or Debian's prometheus package)" >&2; exit 2; }
work="$tools/prometheus-deb"
rm -rf "$work" && mkdir -p "$work"
cd "$work"
echo "fetching Debian's prometheus package for promtool (once)" >&2
apt-get download prometheus >&2 \
  || { [ "$(id -u)" = 0 ] && apt-get update -qq >&2 && apt-get download prometheus >&2; } \
  || { echo "no promtool: apt-get could not download the prometheus package" >&2; exit 2; }
dpkg-deb -x prometheus_*.deb unpacked
cp unpacked/usr/bin/promtool "$tools/promtool"
cd "$tools" && rm -rf "$work"
echo "$tools/promtool"
