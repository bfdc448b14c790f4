#!/bin/sh
# Prints the path of PROGRAM, a benchmark's tool that Debian packages under the same name
# (valgrind for `make bench-instructions`, wrk for `make bench`'s wrk.py): the one on PATH, else
# Debian's package, installed once with apt-get (as root).
# Usage: debian-package.sh PROGRAM
set -eu
program=$1
if command -v "$program" >/dev/null 2>&1; then command -v "$program"; exit 0; fi
command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
  || { echo "no $program: install $program (Debian's package: apt-get install $program, as root)" >&2; exit 2; }
echo "installing Debian's $program package (once)" >&2
apt-get install -y -qq --no-install-recommends "$program" >&2 \
  || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "$program" >&2; } \
  || { echo "no $program: apt-get could not install the $program package" >&2; exit 2; }
command -v "$program"
