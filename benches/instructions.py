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
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

from stand_in import first_answer, free_ports, prepare, routes, serve_args, wait_ready

FEW, MANY = 100, 600
# The count moves a little with the threads' timing (how many lines the audit writer takes at
# once, when the runtime parks): up to 4% on the eviction, the smallest review. The median of
# three, with the range.
ROUNDS = 3


def instructions(valgrind, binary, work, route, requests):
    """Instructions callgrind counts over a whole `busyguard serve` that answers `requests`
    reviews of `route`, after the route's first answer (`first_answer`) is checked."""
    listen, admin = free_ports(2)
    out = work / "callgrind.out"
    with open(work / "serve.log", "w") as log:
        serve = subprocess.Popen(
            [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}"] + serve_args(binary, work, listen, admin),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(admin, serve, work / "serve.log", "under callgrind")
        context = ssl.create_default_context(cafile=str(work / "ca.crt"))
        connection = http.client.HTTPSConnection("127.0.0.1", listen, context=context)
        first_answer(connection, route)
        for _ in range(requests):
            connection.request("POST", route.path, route.body, {"Content-Type": "application/json"})
            connection.getresponse().read()
        connection.close()
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=120)
    totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    return int(totals.group(1))


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
        prepare(work, builds[0], now)
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
            print(f"| {route.name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    os.environ.pop("KUBECONFIG", None)
    main()
