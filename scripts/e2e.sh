#!/usr/bin/env bash
# A smoke run of busyguard against the cluster KUBECONFIG points at (`make e2e-cluster`).
#
# Uses the busyguard registered in that cluster (deployed from manifests/, or `make run` plus
# `make dev-register`); when none is registered, starts one here from this checkout and
# registers it by URL (the API server must reach 127.0.0.1 then, as a local control plane does).
#
# Exit status: 0 when every assertion held, 1 when one failed, 2 when nothing could be tested
# (no cluster reachable, busyguard's audit lines not readable).
#
# Environment: KUBECTL (kubectl), E2E_TIMEOUT (seconds per wait, 120), E2E_IMAGE (the workers'
# image, registry.k8s.io/pause:3.9), BUSYGUARD_AUDIT_LOG (the audit file of a `make run` busyguard).
set -euo pipefail

KUBECTL=${KUBECTL:-kubectl}
WAIT=${E2E_TIMEOUT:-120}
IMAGE=${E2E_IMAGE:-registry.k8s.io/pause:3.9}
NS=busyguard-e2e-$(date +%s)-$$
APP=busyguard-e2e-worker
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
LOCAL_URL=https://127.0.0.1:18443
LOCAL_ADMIN=127.0.0.1:18080

NAMESPACE_CREATED=""
LOCAL_PID=""
LOCAL_WEBHOOKS=""
DRAIN_PID=""
CORDONED=""
AUDIT_FROM=""

say() { printf 'e2e: %s\n' "$*" >&2; }
pass() { say "ok: $*"; }
fail() {
    say "FAIL: $*"
    exit 1
}
k() { "$KUBECTL" --request-timeout=20s "$@"; }
kn() { k -n "$NS" "$@"; }
rollout() { "$KUBECTL" -n "$NS" rollout status deployment/worker --timeout="${WAIT}s" >/dev/null; } # a watch

# eventually DESCRIPTION COMMAND...: retries COMMAND every second for E2E_TIMEOUT seconds.
eventually() {
    local what=$1 deadline=$((SECONDS + WAIT))
    shift
    until "$@"; do
        ((SECONDS < deadline)) || fail "$what (waited ${WAIT}s)"
        sleep 1
    done
    pass "$what"
}

cleanup() {
    local status=$?
    set +e
    [[ -n $DRAIN_PID ]] && kill "$DRAIN_PID" 2>/dev/null
    [[ -n $CORDONED ]] && k uncordon "$CORDONED" >/dev/null
    if [[ -n $NAMESPACE_CREATED ]]; then
        # Idle first, so that nothing is left busy behind the namespace's deletion.
        kn label pods --all busyguard.io/busy=false --overwrite >/dev/null 2>&1
        k delete namespace "$NS" --wait=false >/dev/null && say "deleting namespace $NS"
    fi
    [[ -n $LOCAL_WEBHOOKS ]] && k delete -f "$LOCAL_WEBHOOKS" --ignore-not-found >/dev/null
    [[ -n $LOCAL_PID ]] && kill "$LOCAL_PID" 2>/dev/null && wait "$LOCAL_PID" 2>/dev/null
    ((status == 0)) && say "PASS: every assertion held"
    if ((status == 1)); then
        say "kept for a look: $WORK (the drain's output, and the local busyguard's log and audit lines if it ran)"
    else
        rm -rf "$WORK"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

preflight() {
    local out
    if ! out=$("$KUBECTL" --request-timeout=10s get --raw /readyz 2>&1); then
        say "no cluster reachable through KUBECONFIG=${KUBECONFIG:-~/.kube/config}:"
        say "  $out"
        say "nothing was tested: point KUBECONFIG at a cluster and run again"
        exit 2
    fi
    local registered
    registered=" $(k get validatingwebhookconfigurations -o jsonpath='{.items[*].metadata.name}') "
    if [[ $registered == *" busyguard "* || $registered == *" busyguard-dev "* ]]; then
        if [[ -n ${BUSYGUARD_AUDIT_LOG:-} ]]; then
            AUDIT_FROM=file:$BUSYGUARD_AUDIT_LOG
        elif k get deployment -n busyguard busyguard -o name >/dev/null 2>&1; then
            AUDIT_FROM=deployment
        else
            say "busyguard is registered, but its audit lines are out of reach: set BUSYGUARD_AUDIT_LOG"
            say "to the --audit-log file of the busyguard the cluster calls"
            exit 2
        fi
        say "using the busyguard registered in the cluster (audit lines from ${AUDIT_FROM})"
    else
        start_local_busyguard
    fi
}

start_local_busyguard() {
    say "no busyguard registered: starting one from this checkout at $LOCAL_URL"
    command -v curl >/dev/null || { say "curl is needed to see the local busyguard turn ready"; exit 2; }
    (cd "$ROOT" && cargo build --quiet --locked) || exit 2
    local bin=$ROOT/target/debug/busyguard
    "$bin" certs --dir "$ROOT/certs" >/dev/null || exit 2
    "$bin" serve --listen "${LOCAL_URL#https://}" --admin-listen "$LOCAL_ADMIN" \
        --tls-cert "$ROOT/certs/tls.crt" --tls-key "$ROOT/certs/tls.key" \
        --audit-log "$WORK/audit.jsonl" >"$WORK/busyguard.log" 2>&1 &
    LOCAL_PID=$!
    AUDIT_FROM=file:$WORK/audit.jsonl
    local deadline=$((SECONDS + 30))
    until curl -sf "http://$LOCAL_ADMIN/readyz" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)) || ! kill -0 "$LOCAL_PID" 2>/dev/null; then
            say "the local busyguard did not turn ready; its log:"
            cat "$WORK/busyguard.log" >&2
            exit 2
        fi
        sleep 0.5
    done
    LOCAL_WEBHOOKS=$WORK/webhooks.yaml
    "$bin" dev-webhooks --url "$LOCAL_URL" --ca-file "$ROOT/certs/ca.crt" >"$LOCAL_WEBHOOKS" || exit 2
    k apply -f "$LOCAL_WEBHOOKS" >/dev/null || exit 2
    sleep 3 # the API server picks up new webhook configurations asynchronously
}

audit_lines() {
    case $AUDIT_FROM in
    file:*) cat "${AUDIT_FROM#file:}" 2>/dev/null ;;
    deployment) k logs -n busyguard -l app.kubernetes.io/name=busyguard --tail=-1 2>/dev/null ;;
    esac
}

# audit_has DECISION POD FRAGMENT...: an audit line of this namespace and decision, for POD
# (any pod when empty), holding every fragment.
audit_has() {
    local lines
    lines=$(audit_lines | grep -F "\"namespace\":\"$NS\"" | grep -F "\"decision\":\"$1\"") || return 1
    [[ -z $2 ]] || lines=$(grep -F "\"name\":\"$2\"" <<<"$lines") || return 1
    shift 2
    for fragment in "$@"; do
        lines=$(grep -F -- "$fragment" <<<"$lines") || return 1
    done
}

pods() { kn get pods -l "app=$APP" -o go-template='{{range .items}}{{.metadata.name}} {{end}}'; }
live_pods() {
    kn get pods -l "app=$APP" \
        -o go-template='{{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}} {{end}}{{end}}'
}
pods_are() { [[ $(pods) == "$1" ]]; }
live_pods_are() { [[ $(live_pods) == "$1" ]]; }
gone() { [[ -z $(kn get pod "$1" --ignore-not-found -o name) ]]; }
annotation() { kn get pod "$1" -o jsonpath="{.metadata.annotations.${2//./\\.}}"; }
mark() { kn label pod "$1" "busyguard.io/busy=$2" --overwrite >/dev/null; } # the app's one PATCH

create_workers() {
    k create namespace "$NS" >/dev/null
    NAMESPACE_CREATED=yes
    kn apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: worker
spec:
  replicas: 5
  selector:
    matchLabels: {app: $APP}
  template:
    metadata:
      labels: {app: $APP, busyguard.io/busy: "false"}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: worker
          image: $IMAGE
---
apiVersion: v1
kind: Service
metadata:
  name: worker
spec:
  selector: {app: $APP, busyguard.io/busy: "false"}
  ports:
    - port: 80
EOF
    rollout ||
        fail "5 workers did not become available in ${WAIT}s (image $IMAGE; set E2E_IMAGE)"
    pass "namespace $NS: 5 workers and a Service of the idle ones"
}

preflight
create_workers

read -r BUSY1 BUSY2 _ <<<"$(pods)"
mark "$BUSY1" true
mark "$BUSY2" true
for pod in "$BUSY1" "$BUSY2"; do
    [[ -n $(annotation "$pod" busyguard.io/busy-since) && -n $(annotation "$pod" controller.kubernetes.io/pod-deletion-cost) ]] ||
        fail "$pod turned busy but has no busy-since or deletion cost: the API server does not reach busyguard's mutating webhook"
done
pass "$BUSY1 and $BUSY2 marked busy: busy-since and deletion cost written on the same PATCH"

say "scale 5 -> 2"
kn scale deployment/worker --replicas=2 >/dev/null
eventually "scale to 2 removed the 3 idle pods and kept both busy ones" pods_are "$BUSY1 $BUSY2 "

say "scale 2 -> 1, both busy"
kn scale deployment/worker --replicas=1 >/dev/null
eventually "the ReplicaSet controller's delete of a busy pod is refused and audited" \
    audit_has denied "" '"operation":"DELETE"' '"reason":"busy"'
sleep 5
live_pods_are "$BUSY1 $BUSY2 " || fail "a busy pod went while the scale-down waited: $(live_pods)"
pass "both busy pods stay while the ReplicaSet controller retries"
mark "$BUSY1" false
eventually "$BUSY1, now idle, was removed" gone "$BUSY1"
live_pods_are "$BUSY2 " || fail "expected only $BUSY2 to remain, found: $(live_pods)"
pass "$BUSY2, still busy, stays"

NODE=$(kn get pod "$BUSY2" -o jsonpath='{.spec.nodeName}')
[[ -n $NODE ]] || fail "$BUSY2 is not on a node"
say "drain node $NODE (only this test's pods)"
CORDONED=$NODE
"$KUBECTL" drain "$NODE" --pod-selector="app=$APP" --ignore-daemonsets --delete-emptydir-data \
    --timeout="$((WAIT * 2))s" >"$WORK/drain.log" 2>&1 &
DRAIN_PID=$!
drain_refused() { grep -q "is busy since" "$WORK/drain.log"; }
eventually "the drain's eviction of $BUSY2 is answered 429 (kubectl: will retry)" drain_refused
grep -q "will retry after" "$WORK/drain.log" || fail "kubectl drain did not treat the refusal as a retry: $(cat "$WORK/drain.log")"
audit_has denied "$BUSY2" '"subresource":"eviction"' >/dev/null || fail "no audit line for the refused eviction of $BUSY2"
kill -0 "$DRAIN_PID" 2>/dev/null || fail "the drain ended while $BUSY2 was busy: $(cat "$WORK/drain.log")"
! gone "$BUSY2" || fail "$BUSY2 was evicted while busy"
pass "the drain waits for $BUSY2"
mark "$BUSY2" false
drain_status=0
wait "$DRAIN_PID" || drain_status=$?
DRAIN_PID=""
((drain_status == 0)) || fail "the drain did not complete once $BUSY2 was idle: $(cat "$WORK/drain.log")"
gone "$BUSY2" || [[ -n $(kn get pod "$BUSY2" -o jsonpath='{.metadata.deletionTimestamp}') ]] ||
    fail "the drain completed but $BUSY2 is still there"
pass "the drain completed once $BUSY2 was idle"
k uncordon "$NODE" >/dev/null
CORDONED=""

say "delete a busy pod by hand"
rollout || fail "the replacement worker did not start"
read -r VICTIM _ <<<"$(live_pods)"
mark "$VICTIM" true
if out=$(kn delete pod "$VICTIM" --wait=false 2>&1); then
    fail "deleting busy $VICTIM was allowed: $out"
fi
[[ $out == *"is busy since"* && $out == *"busyguard.io/busy=false"* ]] ||
    fail "the refusal does not say what to do: $out"
pass "deleting busy $VICTIM is refused: $out"
marked_for_delete() { [[ -n $(annotation "$1" busyguard.io/delete-requested) ]]; }
eventually "$VICTIM is marked delete-requested" marked_for_delete "$VICTIM"
audit_has denied "$VICTIM" '"reason":"busy-delete-deferred"' ||
    fail "no audit line for the refused delete of $VICTIM (a user named system:* is not deferred)"
mark "$VICTIM" false
eventually "$VICTIM, now idle, was deleted by busyguard" gone "$VICTIM"
eventually "the deferred delete of $VICTIM is audited once" audit_has deleted-when-idle "$VICTIM"
count=$(audit_lines | grep -F "\"namespace\":\"$NS\"" | grep -F '"decision":"deleted-when-idle"' |
    grep -cF "\"name\":\"$VICTIM\"" || true)
((count == 1)) || fail "the deferred delete of $VICTIM was carried out $count times"
