#!/bin/sh
# Prints the path of PROGRAM, a benchmark's tool that Debian packages (valgrind for `make
# bench-instructions`; wrk, openssl and perf, from linux-perf, for `make bench`'s wrk.py): the one
# on PATH, else Debian's PACKAGE (PROGRAM's own name unless given), installed once with apt-get
# (as root).
# Usage: debian-package.sh PROGRAM [PACKAGE]
set -eu
program=$1
package=${2:-$1}
if command -v "$program" >/dev/null 2>&1; then command -v "$program"; exit 0; fi
command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
  || { echo "no $program: install it (Debian's package: apt-get install $package, as root)" >&2; exit 2; }
echo "installing Debian's $package package (once)" >&2
apt-get install -y -qq --no-install-recommends "$package" >&2 \
  || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "$package" >&2; } \
  || { echo "no $program: apt-get could not install the $package package" >&2; exit 2; }
command -v "$program"
