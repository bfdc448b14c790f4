#!/bin/sh
# Prints the path of a valgrind for `make bench-instructions` (benches/instructions.py): the one on
# PATH, else Debian's valgrind package, installed once with apt-get (as root).
set -eu
if command -v valgrind >/dev/null 2>&1; then command -v valgrind; exit 0; fi
command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
  || { echo "no valgrind: install valgrind (Debian's package: apt-get install valgrind, as root)" >&2; exit 2; }
echo "installing Debian's valgrind package (once)" >&2
apt-get install -y -qq --no-install-recommends valgrind >&2 \
  || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends valgrind >&2; } \
  || { echo "no valgrind: apt-get could not install the valgrind package" >&2; exit 2; }
command -v valgrind
