#!/usr/bin/env python3
"""Requests a second on each route as issue 54 measured them, this build beside the previous
release and the Go peer, taking turns (`make bench`'s last step, `make bench-wrk`; BENCHMARKS.md).

Each server runs alone on the first core, wrk on the second: one thread, 16 keep-alive TLS
connections, the route's review again and again, a second to warm up and SECONDS measured.
busyguard serves as deployed (TLS, watching a stand-in API server that lists the one busy pod the
eviction names, the audit line written to a file); the Go peer (`benches/go-peer.sh`) is told the
same pod is busy. Each route is measured ROUNDS times, the builds taking turns within a round so
that the host's drift falls on all of them alike. Prints each run's requests a second, the ratios
within each round and their median, the median p99, and the median of the server's CPU a
request (user and system, from /proc).

Usage: wrk.py WRK THIS_BUILD [PREVIOUS_BUILD [GO_PEER]]  (an empty argument: that one is left out)
BENCH_ROUTES=eviction,delete measures only the routes whose names contain one of the words;
BENCH_ROUNDS sets the rounds (5).
"""

import datetime
import http.client
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stand_in import busy_pod_name, first_answer, free_ports, prepare, routes, serve_args, wait_ready

SECONDS = 5
# The host's speed drifts a few percent between runs: five rounds, and the median of the ratios.
ROUNDS = 5
CONNECTIONS = 16
TICKS = os.sysconf("SC_CLK_TCK")
GO_PEER = "Go peer"


def pinned_to(core):
    """Runs the child on `core` alone, when the machine has more than one."""
    if len(os.sched_getaffinity(0)) < 2:
        return None
    chosen = sorted(os.sched_getaffinity(0))[core]
    return lambda: os.sched_setaffinity(0, {chosen})


def start(build, work, route):
    """Starts `build` on the first core; returns the process and its TLS port once it answers
    the route as it should."""
    name, binary = build
    listen, admin = free_ports(2)
    log = work / f"{name}.log"
    if name == GO_PEER:
        args = [binary, "-listen", f"127.0.0.1:{listen}", "-cert", str(work / "tls.crt")]
        args += ["-key", str(work / "tls.key"), "-busy", busy_pod_name()]
    else:
        args = serve_args(binary, work, listen, admin)
    with open(log, "w") as out:
        server = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pinned_to(0))
    try:
        if name == GO_PEER:
            wait_listening(listen, server, log)
        else:
            wait_ready(admin, server, log, "under wrk")
        connection = http.client.HTTPSConnection(
            "127.0.0.1", listen, context=ssl.create_default_context(cafile=str(work / "ca.crt"))
        )
        first_answer(connection, route)
        connection.close()
    except BaseException:
        # Exiting here (a wrong answer, no readiness) leaves no server behind.
        server.kill()
        server.wait()
        raise
    return server, listen


def wait_listening(port, server, log):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the Go peer exited: {log.read_text()[-2000:]}")
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("the Go peer did not listen within 30 s")


def cpu_seconds(pid):
    """User and system CPU of a process so far."""
    # The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def wrk(wrk_binary, script, port, route, seconds):
    """wrk's output for `seconds` of the route."""
    args = [wrk_binary, "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency", "-s", str(script)]
    done = subprocess.run(
        args + [f"https://127.0.0.1:{port}{route.path}"], capture_output=True, text=True, preexec_fn=pinned_to(1)
    )
    if done.returncode != 0 or "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
        sys.exit(f"wrk on {route.name} did not get only 200s:\n{done.stdout}{done.stderr}")
    return done.stdout


def duration_ms(text):
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000}[unit]


def measure(wrk_binary, build, work, route, script):
    """(requests a second, p99 in ms, user and system CPU µs a request) of one run."""
    server, port = start(build, work, route)
    try:
        wrk(wrk_binary, script, port, route, 1)
        user_before, system_before = cpu_seconds(server.pid)
        out = wrk(wrk_binary, script, port, route, SECONDS)
        user_after, system_after = cpu_seconds(server.pid)
    finally:
        # busyguard drains on it; the Go peer exits.
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
        (work / "audit.log").unlink(missing_ok=True)
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    per_second = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = duration_ms(re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE).group(1))
    micros = lambda seconds: seconds * 1e6 / requests
    return per_second, p99, micros(user_after - user_before), micros(system_after - system_before)


def lua_script(work, route):
    """wrk's script: POST the route's review."""
    body = route.body.decode()
    assert "]==]" not in body, "the review would end the Lua string"
    script = work / f"{route.path.strip('/')}-{len(body)}.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = [==[{body}]==]\n"
    )
    return script


def chosen_routes(now):
    """The routes BENCH_ROUTES names (every route when it is unset)."""
    every = routes(now)
    words = [word.strip() for word in os.environ.get("BENCH_ROUTES", "").split(",") if word.strip()]
    chosen = [route for route in every if not words or any(word in route.name for word in words)]
    if not chosen:
        sys.exit(f"BENCH_ROUTES={os.environ['BENCH_ROUTES']!r} names none of: {', '.join(r.name for r in every)}")
    return chosen


def rounds_each():
    """BENCH_ROUNDS, or ROUNDS when it is unset."""
    rounds = os.environ.get("BENCH_ROUNDS", str(ROUNDS))
    if not rounds.isdigit() or int(rounds) < 1:
        sys.exit(f"BENCH_ROUNDS={rounds!r}: a whole number of rounds, at least 1")
    return int(rounds)


def main():
    if not 3 <= len(sys.argv) <= 5:
        sys.exit("Usage: " + __doc__.split("Usage: ")[1].splitlines()[0])
    wrk_binary = sys.argv[1]
    named = zip(["this build", "previous release", GO_PEER], sys.argv[2:])
    builds = [(name, str(Path(binary).resolve())) for name, binary in named if binary]
    if len(os.sched_getaffinity(0)) < 2:
        print("one core only: server and wrk share it, and the figures say less", file=sys.stderr)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    measured, round_count = chosen_routes(now), rounds_each()
    names = [name for name, _ in builds]
    print(
        f"wrk: {CONNECTIONS} keep-alive TLS connections, {SECONDS} s a run, {round_count} rounds taking turns;"
        " each server on one core, wrk on another"
    )
    ratios = [f"this / {'previous' if name == 'previous release' else 'Go'}" for name in names[1:]]
    header = [f"{name} req/s" for name in names] + ratios
    header += ["p99 ms " + " / ".join(names), "CPU µs/req (user + system) " + " / ".join(names)]
    print("| route | " + " | ".join(header) + " |")
    print("|---" * (len(header) + 1) + "|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepare(work, builds[0][1], now)
        for route in measured:
            serving = [build for build in builds if build[0] != GO_PEER or route.go_peer_serves]
            script = lua_script(work, route)
            rounds = [
                {name: measure(wrk_binary, (name, binary), work, route, script) for name, binary in serving}
                for _ in range(round_count)
            ]
            print(f"| {route.name} | " + " | ".join(row(names, rounds)) + " |", flush=True)


def row(names, rounds):
    """The table's cells for one route: each run's requests a second, this build's ratio to each
    other build within each round and their median, the medians of p99 and of CPU a request; a
    dash where a build does not serve the route."""
    runs = lambda name: [round_[name] for round_ in rounds if name in round_]
    joined = lambda values, form: " · ".join(form.format(value) for value in values) or "–"
    cells = [joined((run[0] for run in runs(name)), "{:,.0f}") for name in names]
    for other in names[1:]:
        ratios = [round_[names[0]][0] / round_[other][0] for round_ in rounds if other in round_]
        cells.append(f"{joined(ratios, '{:.2f}')} (median {statistics.median(ratios):.2f})" if ratios else "–")

    def median(name, field):
        return statistics.median(run[field] for run in runs(name))

    served = [name for name in names if runs(name)]
    cells.append(" / ".join(f"{median(name, 1):.2f}" if name in served else "–" for name in names))
    cells.append(
        " / ".join(f"{median(name, 2):.1f} + {median(name, 3):.1f}" if name in served else "–" for name in names)
    )
    return cells


if __name__ == "__main__":
    os.environ.pop("KUBECONFIG", None)
    main()
