#!/bin/sh
# Builds the previous release of busyguard (the commit the upgrade scenario installs) in release
# mode, once per clone, under target/previous-release/, and prints the binary's path: `make bench`
# measures it beside this checkout's build, taking turns, so that a regression shows as a ratio
# below 1 on the same machine. Prints nothing in a clone without that commit (a shallow one).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
# tests/e2e/scenarios/upgrade.rs PREVIOUS_RELEASE: the last release (0.3.0).
commit=$(sed -n 's/^const PREVIOUS_RELEASE: &str = "\([0-9a-f]*\)";/\1/p' "$root/tests/e2e/scenarios/upgrade.rs")
git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null || exit 0
out=$root/target/previous-release/$commit
binary=$out/release/busyguard
if [ ! -x "$binary" ]; then
	echo "building busyguard $commit, the previous release, in release mode (once, into $out)" >&2
	rm -rf "$out/src" && mkdir -p "$out/src"
	git -C "$root" archive "$commit" | tar -x -C "$out/src"
	${CARGO:-cargo} build --release --locked --bin busyguard --manifest-path "$out/src/Cargo.toml" --target-dir "$out" >&2
fi
echo "$binary"
