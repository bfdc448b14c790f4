"""What the Python benches share (`instructions.py`, `wrk.py`): the load bench's four routes, the
stand-in API server busyguard's view watches, and starting a build as deployed."""

import base64
import http.client
import json
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

# A route measured: `expected` is what its answer must say; the Go peer decides only some, and
# busyguard without a view only those whose review carries the pod it judges.
Route = namedtuple("Route", "name path body expected go_peer_serves carries_its_pod")


def load(name):
    return json.loads((FIXTURES / name).read_text())


def made_busy(pod, now):
    """`pod`, labelled busy and busy since `now`, as busyguard's webhook writes it."""
    pod["metadata"].setdefault("annotations", {})["busyguard.io/busy-since"] = now
    pod["metadata"].setdefault("labels", {})["busyguard.io/busy"] = "true"
    return pod


def routes(now):
    """The load bench's four scenarios."""
    delete = load("pod-delete-by-replicaset-controller.json")
    made_busy(delete["request"]["oldObject"], now)
    compact = lambda review: json.dumps(review, separators=(",", ":")).encode()
    return [
        Route(
            "eviction, busy pod (429)",
            "/validate",
            compact(load("pod-eviction-by-user.json")),
            '"code":429',
            go_peer_serves=True,
            carries_its_pod=False,
        ),
        Route(
            "delete, busy pod (429)",
            "/validate",
            compact(delete),
            '"code":429',
            go_peer_serves=True,
            carries_its_pod=True,
        ),
        Route(
            "pod update to busy (patch)",
            "/mutate",
            compact(load("pod-update-label-busy-by-user.json")),
            '"patch":',
            go_peer_serves=True,
            carries_its_pod=True,
        ),
        Route(
            "scale subresource down",
            "/validate",
            compact(load("deployment-scale-subresource-down-by-kubectl.json")),
            '"allowed":true',
            go_peer_serves=False,
            carries_its_pod=False,
        ),
    ]


def busy_pod_name():
    """namespace/name of the pod the eviction names."""
    eviction = load("pod-eviction-by-user.json")["request"]
    return f"{eviction['namespace']}/{eviction['name']}"


def busy_pod(now):
    """The pod the eviction names, busy since `now`, as the API server lists it."""
    namespace, name = busy_pod_name().split("/")
    pod = load("pod-delete-by-replicaset-controller.json")["request"]["oldObject"]
    pod["metadata"].update(name=name, namespace=namespace, annotations={})
    return json.dumps(made_busy(pod, now))


def stand_in_api_server(listed):
    """Lists the pod `listed[0]` (JSON, replaceable), no namespace and no node; watches bring
    nothing; 201 to every write. Returns its port."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, status, body):
            body = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if query.get("watch") == ["true"]:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                time.sleep(int(query.get("timeoutSeconds", ["290"])[0]))
                self.wfile.write(b"0\r\n\r\n")
                return
            kind, items = {
                "/api/v1/pods": ("PodList", listed[0]),
                "/api/v1/namespaces": ("NamespaceList", ""),
                "/api/v1/nodes": ("NodeList", ""),
            }.get(url.path, (None, None))
            if kind is None:
                return self.answer(200, "{}")
            self.answer(200, f'{{"kind":"{kind}","apiVersion":"v1","metadata":{{"resourceVersion":"1"}},"items":[{items}]}}')

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.answer(201, "{}")

        do_PATCH = do_POST

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            # busyguard stopping mid-request (each measured server is stopped with SIGINT) is
            # how a run ends, not an error to print.
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def prepare(work, binary, now):
    """Writes into `work` the TLS files (`busyguard certs`) and a kubeconfig naming a stand-in
    API server that lists the busy pod as `binary`'s mutating webhook leaves it."""
    subprocess.run([binary, "certs", "--dir", work], check=True, stdout=subprocess.DEVNULL)
    listed = [busy_pod(now)]
    api = stand_in_api_server(listed)
    (work / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{api}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u, namespace: default}}]\n"
        "users: [{name: u, user: {}}]\n"
    )
    listed[0] = json.dumps(planned(binary, work, json.loads(listed[0])))


def planned(binary, work, pod):
    """`pod` with the patch `binary`'s mutating webhook answers to an update of it applied: the
    marks its plan gives a busy pod. Listed so, nothing is stale, and a scale-down that selects
    it has nothing to patch (as in the load bench, `benches/load.rs`'s `planned_pod`)."""
    review = load("pod-update-label-busy-by-user.json")
    request = review["request"]
    request.update(object=pod, oldObject=pod, name=pod["metadata"]["name"], namespace=pod["metadata"]["namespace"])
    body = json.dumps(review).encode()
    listen, admin = free_ports(2)
    log = work / "planning.log"
    with open(log, "w") as out:
        serve = subprocess.Popen(serve_args(binary, work, listen, admin), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(admin, serve, log, "planning the busy pod")
        context = ssl.create_default_context(cafile=str(work / "ca.crt"))
        connection = http.client.HTTPSConnection("127.0.0.1", listen, context=context)
        planning = Route(
            "planning the busy pod", "/mutate", body, '"allowed":true', go_peer_serves=False, carries_its_pod=True
        )
        answer = first_answer(connection, planning)
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=120)
    patch = json.loads(answer)["response"].get("patch")
    for operation in json.loads(base64.b64decode(patch)) if patch else []:
        if operation["op"] not in ("add", "replace"):
            sys.exit(f"planning the busy pod: a patch operation this bench does not apply: {operation}")
        *parents, key = [part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]]
        target = pod
        for part in parents:
            target = target.setdefault(part, {})
        target[key] = operation["value"]
    return pod


def free_ports(count):
    """`count` distinct free ports, all held until the last is picked."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def serve_args(binary, work, listen, admin, cluster=True):
    """`busyguard serve` as deployed: TLS, the stand-in's view (none with `cluster` false:
    `--no-cluster`), the audit line to a file."""
    view = ["--kubeconfig", str(work / "kubeconfig")] if cluster else ["--no-cluster"]
    return (
        [binary, "serve", "--listen", f"127.0.0.1:{listen}", "--admin-listen", f"127.0.0.1:{admin}"]
        + ["--tls-cert", str(work / "tls.crt"), "--tls-key", str(work / "tls.key")]
        + view
        + ["--audit-log", str(work / "audit.log")]
    )


def wait_ready(admin, serve, log, how):
    """Until busyguard's /readyz answers 200; exits if it stops first or takes 120 s."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            sys.exit(f"busyguard exited {how}: {log.read_text()[-2000:]}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", admin, timeout=1)
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"busyguard was not ready within 120 s {how}")


def first_answer(connection, route):
    """Sends the route's review until the answer is not a 503 (the view has listed the pods) or
    two minutes have passed, and returns it; exits if that answer is not the route's (a pod not
    busy, a build that decides otherwise): a measure of it would measure another path."""
    deadline = time.monotonic() + 120
    while True:
        connection.request("POST", route.path, route.body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = response.read().decode()
        if response.status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if route.expected not in answer:
        sys.exit(f"{route.name} was answered {answer[:400]}, not {route.expected}: not the route to measure")
    return answer
