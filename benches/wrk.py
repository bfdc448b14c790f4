#!/usr/bin/env python3
"""Requests a second on each route as issue 54 measured them, this build beside the previous
release, the Go peer and the two floors, taking turns (`make bench`'s last step, `make bench-wrk`;
BENCHMARKS.md).

Each server runs alone on the first core, wrk on the second: one thread, 16 keep-alive TLS
connections, then 64 (BENCH_CONNECTIONS), the route's review again and again, a second to warm
up and SECONDS measured.
busyguard serves as deployed (TLS, watching a stand-in API server that lists the one busy pod the
eviction names, the audit line written to a file); the Go peer (`benches/go-peer.sh`) is told the
same pod is busy. This build serves a second time with `--no-cluster` (no view, no watch) on the
routes whose review carries its pod, the delete and the flip. The floors are the load bench's
(`benches/load.rs`): busyguard's TLS and HTTP stack answering a constant, and the same checking the
review's JSON as busyguard does; what they answer against the Go peer is the most any server on
this stack could, on this machine. Each route is measured ROUNDS times, the builds taking turns
within a round so that the host's drift falls on all of them alike. Prints each run's requests a
second, the ratios within each round and their median, the median p99, and the medians of the
server's CPU a request (user and system, from /proc), and of its system calls and the wake-ups it
makes a request (`perf stat -e raw_syscalls:sys_enter,sched:sched_waking`, where perf may trace the
server), so that a ratio below its target says whether the server or the host spent the time: on
loopback a server's send carries the client's receive, and waking wrk's idle core costs a virtual
machine dearly, so a slower server, finding wrk asleep more often, pays more of the host's time a
request.

Last, new connections as the API server opens them beyond its idle ones: `openssl s_time -new`,
CLIENTS of them on the second core, a full TLS handshake each and no request (the API server's
client, client-go, keeps no TLS session cache, so it resumes none). The client's core is the
bottleneck there, so what compares servers is the CPU each spends a handshake, and the
handshakes a second one core would take at that cost.

Usage: wrk.py WRK THIS_BUILD [PREVIOUS_BUILD [GO_PEER [LOAD_BENCH]]]  (an empty argument: that one is left out)
BENCH_ROUTES=eviction,delete measures only the routes whose names contain one of the words;
BENCH_ROUNDS sets the rounds (5); BENCH_CONNECTIONS the keep-alive connections of each table
(16,64). BENCH_PERF and BENCH_OPENSSL name perf and openssl (else found on PATH; without one,
its measure is left out, saying so).
"""

import datetime
import http.client
import os
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import namedtuple
from pathlib import Path

from stand_in import busy_pod_name, first_answer, free_ports, prepare, routes, serve_args, wait_ready

SECONDS = 5
# The host's speed drifts a few percent between runs: five rounds, and the median of the ratios.
ROUNDS = 5
CONNECTIONS = "16,64"
# openssl s_time clients opening connections at once (each one at a time): enough to keep the
# client's core busy.
CLIENTS = 4
TICKS = os.sysconf("SC_CLK_TCK")
GO_PEER = "Go peer"
# This build again, with `--no-cluster`: no view, no watch. Only the routes whose review carries
# the pod it judges answer the same without a view: the eviction names a pod only the view knows,
# and a scale-down is let through unprepared.
NO_CLUSTER = "this build, --no-cluster"
FLOOR = "floor"
FLOOR_JSON = "floor + JSON"
# The load bench's executable is either floor, as these variables tell it.
FLOOR_ENV = {FLOOR: {}, FLOOR_JSON: {"BUSYGUARD_BENCH_FLOOR_JSON": "1"}}
# wrk, and perf and openssl where found.
Tools = namedtuple("Tools", "wrk perf openssl")


def pinned_to(core):
    """Runs the child on `core` alone, when the machine has more than one."""
    if len(os.sched_getaffinity(0)) < 2:
        return None
    chosen = sorted(os.sched_getaffinity(0))[core]
    return lambda: os.sched_setaffinity(0, {chosen})


def stoppable_on(core):
    """Runs the child on `core` alone, as `pinned_to`, with SIGINT's default action: a bench run in
    the background of a shell without job control inherits SIGINT ignored, and the Go peer and
    the floors, which install no handler of their own, would then never stop."""
    pin = pinned_to(core)

    def prepare():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if pin:
            pin()

    return prepare


def start(build, work, route):
    """Starts `build` on the first core; returns the process and its TLS port once it answers
    the route as it should."""
    name, binary = build
    listen, admin = free_ports(2)
    log = work / f"{name}.log"
    # busyguard says on its admin port when it is ready; the others, by listening.
    env, ready = None, lambda server: wait_listening(name, listen, server, log)
    if name == GO_PEER:
        args = [binary, "-listen", f"127.0.0.1:{listen}", "-cert", str(work / "tls.crt")]
        args += ["-key", str(work / "tls.key"), "-busy", busy_pod_name()]
    elif name in FLOOR_ENV:
        args = [binary]
        env = dict(os.environ, BUSYGUARD_BENCH_FLOOR=str(work), FLOOR_LISTEN=f"127.0.0.1:{listen}", **FLOOR_ENV[name])
        # A floor decides nothing: it lets every review through.
        route = route._replace(expected='"allowed":true')
    else:
        args = serve_args(binary, work, listen, admin, cluster=name != NO_CLUSTER)
        ready = lambda server: wait_ready(admin, server, log, "under wrk")
    with open(log, "w") as out:
        server = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=stoppable_on(0))
    try:
        ready(server)
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


def wait_listening(name, port, server, log):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the {name} exited: {log.read_text()[-2000:]}")
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"the {name} did not listen within 30 s")


def cpu_seconds(pid):
    """User and system CPU of a process so far."""
    # The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def wrk(wrk_binary, script, port, route, seconds, connections):
    """wrk's output for `seconds` of the route."""
    args = [wrk_binary, "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script)]
    done = subprocess.run(
        args + [f"https://127.0.0.1:{port}{route.path}"], capture_output=True, text=True, preexec_fn=pinned_to(1)
    )
    if done.returncode != 0 or "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
        sys.exit(f"wrk on {route.name} did not get only 200s:\n{done.stdout}{done.stderr}")
    return done.stdout


def duration_ms(text):
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000}[unit]


def measure(tools, build, work, route, script, connections):
    """(requests a second, p99 in ms, user and system CPU µs a request, (system calls, wake-ups) a
    request or None) of one run."""
    server, port = start(build, work, route)
    try:
        wrk(tools.wrk, script, port, route, 1, connections)
        with Counted(tools.perf, server.pid) as counted:
            out = wrk(tools.wrk, script, port, route, SECONDS, connections)
    finally:
        stop(server, work)
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    per_second = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = duration_ms(re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE).group(1))
    return (per_second, p99, *counted.per(requests))


def stop(server, work):
    # busyguard drains on it; the Go peer and the floors exit.
    server.send_signal(signal.SIGINT)
    server.wait(timeout=120)
    (work / "audit.log").unlink(missing_ok=True)


class Counted:
    """The server's user and system CPU and, with perf, its system calls and the wake-ups it
    makes, while the block runs."""

    def __init__(self, perf, pid):
        self.perf, self.pid = perf, pid

    def __enter__(self):
        self.counting = None
        if self.perf:
            self.out = tempfile.NamedTemporaryFile(suffix=".perf")
            events = "raw_syscalls:sys_enter,sched:sched_waking"
            args = [self.perf, "stat", "-x", ",", "-e", events, "-p", str(self.pid)]
            self.counting = subprocess.Popen(args + ["-o", self.out.name], stderr=subprocess.DEVNULL)
            # perf attaches within a moment; a call made before it is not counted.
            time.sleep(0.2)
        self.before = cpu_seconds(self.pid)
        return self

    def __exit__(self, *exception):
        self.after = cpu_seconds(self.pid)
        self.events = None
        if self.counting:
            self.counting.send_signal(signal.SIGINT)
            self.counting.wait(timeout=30)
            lines = Path(self.out.name).read_text().splitlines()
            counts = [line.split(",")[0] for event in ("raw_syscalls", "sched_waking") for line in lines if event in line]
            self.events = [int(count) for count in counts] if all(count.isdigit() for count in counts) else None
            self.out.close()
        return False

    def per(self, done):
        """User and system CPU µs, and (system calls, wake-ups), for each of `done` things."""
        user, system = (after - before for before, after in zip(self.before, self.after))
        counted = tuple(count / done for count in self.events) if self.events and len(self.events) == 2 else None
        return user * 1e6 / done, system * 1e6 / done, counted


def handshakes(tools, build, work, route):
    """(handshakes a second, user and system CPU µs a handshake, (system calls, wake-ups) a
    handshake or None) of one run of CLIENTS `openssl s_time -new`, each opening one connection
    after another."""
    server, port = start(build, work, route)
    try:
        args = [tools.openssl, "s_time", "-connect", f"127.0.0.1:{port}", "-new", "-time", str(SECONDS)]
        with Counted(tools.perf, server.pid) as counted:
            clients = [
                subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=pinned_to(1))
                for _ in range(CLIENTS)
            ]
            outs = [client.communicate()[0] for client in clients]
    finally:
        stop(server, work)
    done = 0
    for out in outs:
        found = re.search(r"(\d+) connections in [\d.]+ real seconds", out)
        if not found:
            sys.exit(f"openssl s_time against the {build[0]} did not say how many connections it made:\n{out}")
        done += int(found.group(1))
    return (done / SECONDS, *counted.per(done))


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


def connection_counts():
    """BENCH_CONNECTIONS, or CONNECTIONS when it is unset: the keep-alive connections of each table."""
    counts = [word.strip() for word in os.environ.get("BENCH_CONNECTIONS", CONNECTIONS).split(",")]
    if not counts or not all(count.isdigit() and int(count) > 0 for count in counts):
        sys.exit(f"BENCH_CONNECTIONS={os.environ['BENCH_CONNECTIONS']!r}: connection counts, comma-separated")
    return [int(count) for count in counts]


def tool(variable, name, leaves_out):
    """The program the variable names, else `name` on PATH; None, said once, when neither."""
    found = shutil.which(os.environ.get(variable) or name)
    if not found:
        print(f"no {name} (neither {variable} nor PATH names one): {leaves_out} left out", file=sys.stderr)
    return found


def rounds_each():
    """BENCH_ROUNDS, or ROUNDS when it is unset."""
    rounds = os.environ.get("BENCH_ROUNDS", str(ROUNDS))
    if not rounds.isdigit() or int(rounds) < 1:
        sys.exit(f"BENCH_ROUNDS={rounds!r}: a whole number of rounds, at least 1")
    return int(rounds)


def main():
    if not 3 <= len(sys.argv) <= 6:
        sys.exit("Usage: " + __doc__.split("Usage: ")[1].splitlines()[0])
    named = zip(["this build", "previous release", GO_PEER, "floors"], sys.argv[2:])
    builds = []
    for name, binary in named:
        if binary:
            # The load bench's one executable serves as either floor; this build serves twice.
            served_as = {"floors": list(FLOOR_ENV), "this build": [name, NO_CLUSTER]}.get(name, [name])
            builds += [(each, str(Path(binary).resolve())) for each in served_as]
    if len(os.sched_getaffinity(0)) < 2:
        print("one core only: server and wrk share it, and the figures say less", file=sys.stderr)
    tools = Tools(
        sys.argv[1],
        tool("BENCH_PERF", "perf", "system calls and wake-ups"),
        tool("BENCH_OPENSSL", "openssl", "new connections"),
    )
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    measured, round_count = chosen_routes(now), rounds_each()
    names = [name for name, _ in builds]
    pairs = ratio_pairs(names)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prepare(work, builds[0][1], now)
        for connections in connection_counts():
            print(
                f"\nwrk: {connections} keep-alive TLS connections, {SECONDS} s a run, {round_count} rounds taking"
                " turns; each server on one core, wrk on another"
            )
            header = [f"{name} req/s" for name in names] + [label for label, _, _ in pairs]
            header += ["p99 ms " + " / ".join(names), "CPU µs/req (user + system) " + " / ".join(names)]
            header += ["system calls + wake-ups /req " + " / ".join(names)]
            print("| route | " + " | ".join(header) + " |")
            print("|---" * (len(header) + 1) + "|")
            for route in measured:
                serving = [build for build in builds if serves(build[0], route)]
                script = lua_script(work, route)
                rounds = [
                    {name: measure(tools, (name, binary), work, route, script, connections) for name, binary in serving}
                    for _ in range(round_count)
                ]
                print(f"| {route.name} | " + " | ".join(row(names, pairs, rounds)) + " |", flush=True)
        if tools.openssl:
            new_connections(tools, builds, work, measured[0], round_count)


def serves(name, route):
    """Whether the server answers the route as the others do."""
    if name == GO_PEER:
        return route.go_peer_serves
    if name == NO_CLUSTER:
        return route.carries_its_pod
    return True


def new_connections(tools, builds, work, route, round_count):
    """The table of full TLS handshakes, each server taking turns as above. The floor + JSON has
    the floor's TLS stack, and this build without a cluster this build's: both left out."""
    shaking = [build for build in builds if build[0] not in (FLOOR_JSON, NO_CLUSTER)]
    names = [name for name, _ in shaking]
    print(
        f"\nnew connections: {CLIENTS} `openssl s_time -new` on the second core, a full TLS handshake each, no"
        f" request; {SECONDS} s a run, {round_count} rounds taking turns"
    )
    header = ["handshakes/s " + " / ".join(names), "CPU µs/handshake (user + system) " + " / ".join(names)]
    header += ["a core's handshakes/s at that CPU " + " / ".join(names)]
    header += ["system calls + wake-ups /handshake " + " / ".join(names)]
    print("| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    rounds = [{name: handshakes(tools, (name, binary), work, route) for name, binary in shaking} for _ in range(round_count)]
    median = lambda name, field: statistics.median(round_[name][field] for round_ in rounds)
    cells = [
        " / ".join(f"{median(name, 0):,.0f}" for name in names),
        " / ".join(f"{median(name, 1):.0f} + {median(name, 2):.0f}" for name in names),
        " / ".join(f"{1e6 / (median(name, 1) + median(name, 2)):,.0f}" for name in names),
        " / ".join(counted_events(rounds, name, 3) for name in names),
    ]
    print("| " + " | ".join(cells) + " |", flush=True)


def counted_events(rounds, name, field):
    """The medians of the system calls and of the wake-ups counted, or a dash where perf counted
    none."""
    counted = [round_[name][field] for round_ in rounds if name in round_ and round_[name][field] is not None]
    if not counted:
        return "–"
    return " + ".join(f"{statistics.median(each[i] for each in counted):.2f}" for i in range(2))


def ratio_pairs(names):
    """The ratios printed, as (label, numerator, denominator), of the builds measured: this build
    against the others, and each floor against the Go peer (the most this stack allows here)."""
    pairs = [
        ("this / previous", "this build", "previous release"),
        ("this / this --no-cluster", "this build", NO_CLUSTER),
        ("this / floor + JSON", "this build", FLOOR_JSON),
        ("this / Go", "this build", GO_PEER),
        ("floor / Go", FLOOR, GO_PEER),
        ("floor + JSON / Go", FLOOR_JSON, GO_PEER),
    ]
    return [pair for pair in pairs if pair[1] in names and pair[2] in names]


def row(names, pairs, rounds):
    """The table's cells for one route: each run's requests a second, each pair's ratio within
    each round and their median, the medians of p99, of CPU and of system calls and wake-ups a
    request; a dash where a build does not serve the route."""
    runs = lambda name: [round_[name] for round_ in rounds if name in round_]
    joined = lambda values, form: " · ".join(form.format(value) for value in values) or "–"
    cells = [joined((run[0] for run in runs(name)), "{:,.0f}") for name in names]
    for _, over, under in pairs:
        ratios = [round_[over][0] / round_[under][0] for round_ in rounds if over in round_ and under in round_]
        cells.append(f"{joined(ratios, '{:.2f}')} (median {statistics.median(ratios):.2f})" if ratios else "–")

    def median(name, field):
        return statistics.median(run[field] for run in runs(name))

    served = [name for name in names if runs(name)]
    cells.append(" / ".join(f"{median(name, 1):.2f}" if name in served else "–" for name in names))
    cells.append(
        " / ".join(f"{median(name, 2):.1f} + {median(name, 3):.1f}" if name in served else "–" for name in names)
    )
    cells.append(" / ".join(counted_events(rounds, name, 4) if name in served else "–" for name in names))
    return cells


if __name__ == "__main__":
    os.environ.pop("KUBECONFIG", None)
    main()
