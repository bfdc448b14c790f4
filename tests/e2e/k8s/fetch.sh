#!/usr/bin/env bash
# Downloads kube-apiserver, kube-controller-manager and kube-scheduler of a Kubernetes release
# into DEST, as the upstream release publishes them (RELEASE_URL/VERSION/bin/linux/ARCH/NAME,
# each with NAME.sha256 beside it), and keeps each only if its SHA-256 is the published one.
# Usage: fetch.sh DEST. Env: K8S_VERSION (v1.28.4), K8S_RELEASE_URL (https://dl.k8s.io/release),
# K8S_ARCH (from uname -m).
set -euo pipefail
dest=${1:?usage: fetch.sh DEST}
version=${K8S_VERSION:-v1.28.4}
url=${K8S_RELEASE_URL:-https://dl.k8s.io/release}
case ${K8S_ARCH:-$(uname -m)} in
  x86_64 | amd64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "fetch.sh: no Kubernetes release for $(uname -m)" >&2; exit 2 ;;
esac
mkdir -p "$dest"
for name in kube-apiserver kube-controller-manager kube-scheduler; do
  [[ -x $dest/$name ]] && continue
  from=$url/$version/bin/linux/$arch/$name
  echo "fetch.sh: $from" >&2
  curl -fsSL --retry 3 -o "$dest/$name.part" "$from"
  expected=$(curl -fsSL --retry 3 "$from.sha256" | awk '{print $1}')
  actual=$(sha256sum "$dest/$name.part" | awk '{print $1}')
  if [[ $actual != "$expected" ]]; then
    rm -f "$dest/$name.part"
    echo "fetch.sh: $name: SHA-256 $actual, but the release says $expected" >&2
    exit 1
  fi
  chmod +x "$dest/$name.part"
  mv "$dest/$name.part" "$dest/$name"
done
