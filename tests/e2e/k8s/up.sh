#!/usr/bin/env bash
# A real Kubernetes v1.28.4 control plane on loopback, for end-to-end tests against the real
# kube-apiserver, admission chain, RBAC, ReplicaSet/Deployment/disruption/GC controllers and the
# scheduler: etcd + kube-apiserver + kube-controller-manager + kube-scheduler, controllers with
# their own service-account credentials, 3 fake nodes and a fake kubelet (fake-kubelet.py).
# No container runs: the fake kubelet marks bound pods Running and Ready (docs/development.md).
# Usage: tests/e2e/k8s/up.sh   then: export KUBECONFIG=$K8S_DIR/admin.kubeconfig
# Env: K8S_DIR (state, default /tmp/k8s-local), K8S_BIN (the binaries; without it, those of the
# tarball in K8S_TARBALLS, default ../shared/k8s beside the project, where there is one, else the
# upstream release of K8S_VERSION downloaded into K8S_CACHE, default the project's
# target/k8s, by fetch.sh: checked against their published SHA-256), NODES (default "node-a
# node-b node-c"), APISERVER_EXTRA, KCM_EXTRA. etcd: the PATH's, else Debian's etcd-server
# (installed when missing, as root), else the etcd release's, downloaded with the binaries.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
K8S_DIR=${K8S_DIR:-/tmp/k8s-local}
export K8S_DIR
mkdir -p "$K8S_DIR/pki" "$K8S_DIR/logs"
ROOT=$(cd "$HERE/../../.." && pwd)
if [[ -z ${K8S_BIN:-} ]]; then
  tarballs=${K8S_TARBALLS:-$ROOT/../shared/k8s}
  if compgen -G "$tarballs/k8s-v*-linux-amd64.tar.xz" >/dev/null; then
    K8S_BIN=$K8S_DIR/bin
    [[ -x $K8S_BIN/kube-apiserver ]] || { mkdir -p "$K8S_BIN"; tar -xJf "$tarballs"/k8s-v*-linux-amd64.tar.xz -C "$K8S_BIN"; }
  else
    K8S_BIN=${K8S_CACHE:-$ROOT/target/k8s}/${K8S_VERSION:-v1.28.4}
    # etcd: the PATH's, else Debian's where it can be installed, else the release's.
    etcd_too=
    command -v etcd >/dev/null || { [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; } || etcd_too=--etcd
    "$HERE/fetch.sh" "$K8S_BIN" $etcd_too
  fi
fi
[[ -x $K8S_BIN/etcd ]] && PATH=$K8S_BIN:$PATH
command -v etcd >/dev/null || { apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null; }
command -v kubectl >/dev/null || { echo "up.sh: kubectl is needed" >&2; exit 2; }
cd "$K8S_DIR/pki"

if [[ ! -f ca.crt ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj "/CN=k8s-local-ca" 2>/dev/null
  echo "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1" >apiserver.ext
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 30 -extfile apiserver.ext 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >client.ext
  client() { # file-name subject
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 30 -extfile client.ext 2>/dev/null
  }
  client admin "/O=system:masters/CN=admin"
  client kcm "/CN=system:kube-controller-manager"
  client scheduler "/CN=system:kube-scheduler"
  for n in ${NODES:-node-a node-b node-c}; do client "kubelet-$n" "/O=system:nodes/CN=system:node:$n"; done
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
fi

kubeconfig() { # name
  local f=$K8S_DIR/$1.kubeconfig
  KUBECONFIG=$f kubectl config set-cluster local --server=https://127.0.0.1:6443 --certificate-authority="$K8S_DIR/pki/ca.crt" --embed-certs >/dev/null
  KUBECONFIG=$f kubectl config set-credentials "$1" --client-certificate="$K8S_DIR/pki/$1.crt" --client-key="$K8S_DIR/pki/$1.key" --embed-certs >/dev/null
  KUBECONFIG=$f kubectl config set-context local --cluster=local --user="$1" >/dev/null
  KUBECONFIG=$f kubectl config use-context local >/dev/null
}
for n in admin kcm scheduler; do kubeconfig $n; done

start() { # name command...
  local name=$1; shift
  if [[ -f $K8S_DIR/$name.pid ]] && kill -0 "$(cat "$K8S_DIR/$name.pid")" 2>/dev/null; then return; fi
  setsid "$@" >"$K8S_DIR/logs/$name.log" 2>&1 &
  echo $! >"$K8S_DIR/$name.pid"
}

start etcd etcd --data-dir "$K8S_DIR/etcd" --listen-client-urls http://127.0.0.1:2379 \
  --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 --log-level error
for _ in $(seq 50); do curl -fs http://127.0.0.1:2379/health >/dev/null && break; sleep 0.2; done

start apiserver "$K8S_BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=6443 \
  --tls-cert-file="$K8S_DIR/pki/apiserver.crt" --tls-private-key-file="$K8S_DIR/pki/apiserver.key" \
  --client-ca-file="$K8S_DIR/pki/ca.crt" \
  --service-account-key-file="$K8S_DIR/pki/sa.pub" --service-account-signing-key-file="$K8S_DIR/pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc --api-audiences=https://kubernetes.default.svc \
  --service-cluster-ip-range=10.96.0.0/12 --authorization-mode=Node,RBAC --allow-privileged=true \
  --audit-log-path="$K8S_DIR/logs/audit.log" --audit-policy-file="$HERE/audit-policy.yaml" \
  --enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook ${APISERVER_EXTRA:-}
export KUBECONFIG=$K8S_DIR/admin.kubeconfig
for _ in $(seq 150); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.2; done
kubectl get --raw /readyz >/dev/null

start kcm "$K8S_BIN/kube-controller-manager" --kubeconfig="$K8S_DIR/kcm.kubeconfig" \
  --authentication-kubeconfig="$K8S_DIR/kcm.kubeconfig" --authorization-kubeconfig="$K8S_DIR/kcm.kubeconfig" \
  --use-service-account-credentials=true --service-account-private-key-file="$K8S_DIR/pki/sa.key" \
  --root-ca-file="$K8S_DIR/pki/ca.crt" --leader-elect=false --bind-address=127.0.0.1 --secure-port=10257 \
  --controllers='*,-nodelifecycle,-nodeipam,-route,-service,-cloud-node-lifecycle,-attachdetach,-persistentvolume-binder,-persistentvolume-expander' \
  --horizontal-pod-autoscaler-sync-period=5s ${KCM_EXTRA:-}
start scheduler "$K8S_BIN/kube-scheduler" --kubeconfig="$K8S_DIR/scheduler.kubeconfig" \
  --authentication-kubeconfig="$K8S_DIR/scheduler.kubeconfig" --authorization-kubeconfig="$K8S_DIR/scheduler.kubeconfig" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port=10259

for n in ${NODES:-node-a node-b node-c}; do
  kubectl get node "$n" >/dev/null 2>&1 || kubectl apply -f - >/dev/null <<EON
apiVersion: v1
kind: Node
metadata: {name: $n, labels: {kubernetes.io/hostname: $n}}
EON
  kubectl patch node "$n" --subresource=status --type=merge -p '{"status":{"capacity":{"cpu":"16","memory":"64Gi","pods":"110"},"allocatable":{"cpu":"16","memory":"64Gi","pods":"110"},"addresses":[{"type":"InternalIP","address":"127.0.0.1"},{"type":"Hostname","address":"'"$n"'"}],"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"fake","lastHeartbeatTime":"'"$(date -u +%FT%TZ)"'","lastTransitionTime":"'"$(date -u +%FT%TZ)"'"}]}}' >/dev/null
  kubectl taint node "$n" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
done
start fake-kubelet python3 "$HERE/fake-kubelet.py"
for _ in $(seq 100); do kubectl get sa default >/dev/null 2>&1 && break; sleep 0.3; done
echo "up: export KUBECONFIG=$K8S_DIR/admin.kubeconfig"
