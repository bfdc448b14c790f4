#!/usr/bin/env python3
"""Instructions per review on each route, this build beside the previous release (`make
bench-instructions`, BENCHMARKS.md).

Each build serves as deployed (`busyguard serve`, TLS, watching a stand-in API server that lists
the one busy pod the eviction names) under `valgrind --tool=callgrind`. One keep-alive TLS
connection sends the same review FEW times, then again MANY times in a fresh process; the
difference in instructions, divided by MANY - FEW, is one review's, start-up and shut-down taken
out. Unlike time, which moves 5% from one run to the next on a shared machine, the count moves
little (ROUNDS below), so a regression of a few percent shows. It leaves out the kernel's share
and cycles lost to caches: the load bench (`benches/load.rs`) measures those.

Usage: instructions.py VALGRIND THIS_BUILD [PREVIOUS_BUILD]
"""

import datetime
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

FEW, MANY = 100, 600
# The count moves a little with the threads' timing (how many lines the audit writer takes at
# once, when the runtime parks): up to 4% on the eviction, the smallest review. The median of
# three, with the range.
ROUNDS = 3
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def load(name):
    return json.loads((FIXTURES / name).read_text())


def made_busy(pod, now):
    """`pod`, labelled busy and busy since `now`, as busyguard's webhook writes it."""
    pod["metadata"].setdefault("annotations", {})["busyguard.io/busy-since"] = now
    pod["metadata"].setdefault("labels", {})["busyguard.io/busy"] = "true"
    return pod


def routes(now):
    """(name, path, body, what the answer must say): the load bench's four scenarios."""
    delete = load("pod-delete-by-replicaset-controller.json")
    made_busy(delete["request"]["oldObject"], now)
    compact = lambda review: json.dumps(review, separators=(",", ":")).encode()
    return [
        ("eviction, busy pod (429)", "/validate", compact(load("pod-eviction-by-user.json")), '"code":429'),
        ("delete, busy pod (429)", "/validate", compact(delete), '"code":429'),
        ("pod update to busy (patch)", "/mutate", compact(load("pod-update-label-busy-by-user.json")), '"patch":'),
        (
            "scale subresource down",
            "/validate",
            compact(load("deployment-scale-subresource-down-by-kubectl.json")),
            '"allowed":true',
        ),
    ]


def busy_pod(now):
    """The pod the eviction names, busy since `now`, as the API server lists it."""
    eviction = load("pod-eviction-by-user.json")["request"]
    pod = load("pod-delete-by-replicaset-controller.json")["request"]["oldObject"]
    pod["metadata"].update(name=eviction["name"], namespace=eviction["namespace"], annotations={})
    return json.dumps(made_busy(pod, now))


def stand_in_api_server(pod):
    """Lists `pod`, no namespace and no node; watches bring nothing; 201 to every write."""

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
                "/api/v1/pods": ("PodList", pod),
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

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def free_ports(count):
    """`count` distinct free ports, all held until the last is picked."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def instructions(valgrind, binary, work, route, requests):
    """Instructions callgrind counts over a whole `busyguard serve` that answers `requests`
    reviews of `route`, after one to warm up. Exits if the answer is not the route's
    (a pod not busy, a release that decides otherwise): that count would measure another path."""
    _, path, body, expected = route
    listen, admin = free_ports(2)
    out = work / "callgrind.out"
    with open(work / "serve.log", "w") as log:
        serve = subprocess.Popen(
            [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", binary, "serve"]
            + ["--listen", f"127.0.0.1:{listen}", "--admin-listen", f"127.0.0.1:{admin}"]
            + ["--tls-cert", str(work / "tls.crt"), "--tls-key", str(work / "tls.key")]
            + ["--kubeconfig", str(work / "kubeconfig"), "--audit-log", str(work / "audit.log")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(admin, serve, work)
        context = ssl.create_default_context(cafile=str(work / "ca.crt"))
        connection = http.client.HTTPSConnection("127.0.0.1", listen, context=context)
        send = lambda: connection.request("POST", path, body, {"Content-Type": "application/json"})
        # Warm up, once the view has listed the pods (until then reviews are answered 503).
        deadline = time.monotonic() + 120
        while True:
            send()
            response = connection.getresponse()
            first = response.read().decode()
            if response.status != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for _ in range(requests):
            send()
            connection.getresponse().read()
        connection.close()
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=120)
    if expected not in first:
        sys.exit(f"{binary} answered {route[0]} with {first[:400]}, not {expected}: not the route to measure")
    totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    return int(totals.group(1))


def wait_ready(admin, serve, work):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            sys.exit(f"busyguard exited under callgrind: {(work / 'serve.log').read_text()[-2000:]}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", admin, timeout=1)
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("busyguard was not ready within 120 s under callgrind")


def per_review(valgrind, binary, work, route):
    """The median of ROUNDS counts, and all of them."""
    counts = sorted(
        round((instructions(valgrind, binary, work, route, MANY) - instructions(valgrind, binary, work, route, FEW)) / (MANY - FEW))
        for _ in range(ROUNDS)
    )
    return counts[len(counts) // 2], counts


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[-1])
    valgrind, builds = sys.argv[1], [Path(b).resolve() for b in sys.argv[2:]]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([builds[0], "certs", "--dir", work], check=True, stdout=subprocess.DEVNULL)
        api = stand_in_api_server(busy_pod(now))
        (work / "kubeconfig").write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{api}'}}}}]\n"
            "contexts: [{name: c, context: {cluster: c, user: u, namespace: default}}]\n"
            "users: [{name: u, user: {}}]\n"
        )
        names = ["this build", "previous release"][: len(builds)]
        print(
            f"instructions per review under callgrind ({MANY} reviews less {FEW}, one keep-alive TLS connection;"
            f" the median of {ROUNDS}, and the range)"
        )
        print("| route | " + " | ".join(names) + (" | this against previous |" if len(builds) == 2 else " |"))
        print("|---" * (len(builds) + 1 + (len(builds) == 2)) + "|")
        for route in routes(now):
            measured = [per_review(valgrind, build, work, route) for build in builds]
            cells = [f"{median:,} ({counts[0]:,} to {counts[-1]:,})" for median, counts in measured]
            if len(measured) == 2:
                (this, _), (previous, _) = measured
                cells.append(f"{(this - previous) / previous:+.1%}")
            print(f"| {route[0]} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    os.environ.pop("KUBECONFIG", None)
    main()
