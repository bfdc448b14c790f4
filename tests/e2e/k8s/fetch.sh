#!/usr/bin/env bash
# Downloads kube-apiserver, kube-controller-manager and kube-scheduler of a Kubernetes release
# into DEST, as the upstream release publishes them (RELEASE_URL/VERSION/bin/linux/ARCH/NAME,
# each with NAME.sha256 beside it), and keeps each only if its SHA-256 is the published one.
# With --etcd, etcd too, when none is on the PATH: the etcd release's tarball
# (ETCD_RELEASE_URL/VERSION/etcd-VERSION-linux-ARCH.tar.gz), checked against its SHA256SUMS.
# Usage: fetch.sh DEST [--etcd]. Env: K8S_VERSION (v1.28.4), K8S_RELEASE_URL
# (https://dl.k8s.io/release), ETCD_VERSION (v3.5.9, the one v1.28 ships with), ETCD_RELEASE_URL
# (https://github.com/etcd-io/etcd/releases/download), K8S_ARCH (from uname -m).
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

if [[ ${2:-} == --etcd && ! -x $dest/etcd ]]; then
  etcd_version=${ETCD_VERSION:-v3.5.9}
  etcd_url=${ETCD_RELEASE_URL:-https://github.com/etcd-io/etcd/releases/download}/$etcd_version
  tarball=etcd-$etcd_version-linux-$arch.tar.gz
  echo "fetch.sh: $etcd_url/$tarball" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  curl -fsSL --retry 3 -o "$work/$tarball" "$etcd_url/$tarball"
  curl -fsSL --retry 3 -o "$work/SHA256SUMS" "$etcd_url/SHA256SUMS"
  if ! (cd "$work" && grep " $tarball\$" SHA256SUMS | sha256sum -c --status); then
    echo "fetch.sh: $tarball: SHA-256 not the one in the release's SHA256SUMS" >&2
    exit 1
  fi
  tar -xzf "$work/$tarball" -C "$work"
  install -m 0755 "$work/etcd-$etcd_version-linux-$arch/etcd" "$dest/etcd"
fi
