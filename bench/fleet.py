"""A fleet on one server: heartbeat latency of N simulated workers, idle and under load.

``--load-processes`` (P) processes simulate ``--workers`` (N) GPU hosts against the real ``corral
server``, host i in process i mod P (default: a quarter of the cores, 1 to 8; P = 1: all of them on
the bench's own event loop, as it first ran), each on its own keep-alive connection, at the default
intervals: a worker heartbeat every ``--worker-heartbeat-s`` (15 s, with its GPU readings and its
running list) and a job heartbeat per running job every ``--heartbeat-s`` (5 s, with progress),
each host at a random phase. Per N, on a fresh server and store:

1. register N workers with ``--gpus`` (8) GPUs; submit ``--jobs-per-worker`` (k) jobs per worker of
   ``gpus / k`` GPUs each, class 10 (never preempted), and let each worker claim its k: every GPU
   is busy;
2. warm up ``--settle-s``, then the **idle** window (``--window-s``): heartbeats only, the
   admission cycle on its tick over a snapshot of N workers and N x k running jobs;
3. submit the load: ``--pending`` (20,000) pending single jobs of one GPU and ``--gangs`` (500)
   gangs of 4 x 8 GPUs, class 10 (nothing fits and nothing may be preempted, so every admission
   pass plans over all of it and changes nothing; ``--submit-window``: the heartbeats during its
   first ``--window-s`` measured and printed too), then the **load** window: the same heartbeats
   while someone lists ``GET /jobs?limit=5000`` and ``GET /workers`` every ``--list-every-s``.

Printed per window: heartbeat latency p50 / p99 / max (job and worker heartbeats together, then
apart), the server's CPU in % of one core, the admission passes and their mean time, missed leases
(a job heartbeat answered 409, plus ``corral_jobs_reaped_total``), other failures (5xx, by status),
and the load processes' own lag (how late one sent a heartbeat: when it is large, the client, not
the server, is the bottleneck); each process's recordings are merged, so every figure is the whole
fleet's whatever P. The figure with the target (issue 13): heartbeat p99 under load
within 3x of idle.

With ``--replicas R`` (PostgreSQL), R servers share the store and host i talks to replica i mod R
(what a load balancer in front of them would do); the CPU column is their sum, each one's share
below it, and the admission passes are the leader's. The bench's own submits and lists go to a
replica that leads no loop (read from ``corral_loop_leader``; printed), as an operator's CLI and
dashboards behind a load balancer reach any replica, not always the admission leader. Below each
window too: each replica's main process alone (without its planner and reader processes),
PostgreSQL's CPU and the share of it spent by the backends serving this bench, the load processes'
CPU (all, and the busiest one) and the load average. ``--json FILE`` appends each size's windows as
a JSON line, which ``bench/fleet_fit.py`` fits. With several replicas each one's heartbeat p99 and
max is printed, the admission leader marked. ``--timeline`` polls each replica's ``/metrics`` every
0.25 s for its loops' passes and sets them beside the heartbeats slower than 50 ms (and the
lister's lists): which pass, on which replica, was running while the tail happened; and each
replica's slowest heartbeat sent in each fifth of the window: a tail that falls slice after slice is
a backlog built before the window (the submits of the load) draining, not one the window makes.

    .venv/bin/python bench/fleet.py [--workers 500,2000] [--db sqlite|postgres] [--window-s 20]
        [--batched --jobs-per-worker 8] [--replicas 2] [--json results.jsonl] [--timeline]
        [--load-processes 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

import harness
import machine

TARGET_P99_RATIO = 3.0
#: ``--timeline``: a heartbeat slower than this is recorded with its send time
SLOW_BEAT_S = 0.05
#: ``--timeline``: how often each replica's ``/metrics`` is read for its loops' passes
TIMELINE_POLL_S = 0.25
LOOP_COUNT = re.compile(r'corral_scheduling_cycle_seconds_(count|sum)\{loop="([a-z_]+)"\} ([0-9.e+-]+)')


@dataclass
class Window:
    """What one measuring window saw."""

    name: str
    job_latency: list[float] = field(default_factory=list)
    worker_latency: list[float] = field(default_factory=list)
    list_latency: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    stale: int = 0
    lag: list[float] = field(default_factory=list)
    seconds: float = 0.0
    server_cpu: float = 0.0
    #: each replica's share of ``server_cpu`` (one entry with one server)
    replica_cpu: list[float] = field(default_factory=list)
    #: each replica's own process alone, without its planner and reader processes (the admission pass's
    #: planning): the interpreter the heartbeats queue for
    replica_main_cpu: list[float] = field(default_factory=list)
    postgres_cpu: float = float("nan")
    #: the share of ``postgres_cpu`` spent by the backends serving this bench's servers (the rest:
    #: PostgreSQL's background processes and whoever else shares the database server)
    postgres_own_cpu: float = float("nan")
    #: the load processes' own CPU, together (all N simulated hosts): the client's cost
    driver_cpu: float = 0.0
    #: each load process's share of ``driver_cpu``: one near a core, the client is the bottleneck
    driver_each_cpu: list[float] = field(default_factory=list)
    #: the machine's 1-minute load average as the window started
    load_average: float = 0.0
    admission_passes: float = 0.0
    admission_seconds: float = 0.0
    #: each replica's heartbeat latencies (host i talks to replica i mod R) and admission passes: a
    #: tail on the leader alone is its passes', a tail on every replica the store's
    replica_latency: dict[int, list[float]] = field(default_factory=dict)
    replica_passes: list[float] = field(default_factory=list)
    #: with ``--timeline``: (sent, latency, replica) of each heartbeat slower than SLOW_BEAT_S, and
    #: (from, to, replica, what) of each background loop pass seen by polling ``/metrics`` (it
    #: ended in the poll interval before it was seen) and of each list the lister made
    slow_beats: list[tuple[float, float, int]] = field(default_factory=list)
    passes_seen: list[tuple[float, float, int, str]] = field(default_factory=list)
    reaped: float = 0.0
    started: float = 0.0

    @property
    def heartbeats(self) -> list[float]:
        return self.job_latency + self.worker_latency


@dataclass
class Fleet:
    """The simulated hosts' shared state: the window being recorded (None between windows)."""

    window: Window | None = None
    stopping: bool = False


@dataclass
class SimJob:
    id: str
    attempt: int
    step: int = 0


async def _parallel(count: int, make: object, concurrency: int = 32) -> None:
    """Run ``make(i)`` for i in range(count), ``concurrency`` at a time."""
    queue = iter(range(count))

    async def runner() -> None:
        for index in queue:
            await make(index)  # type: ignore[operator]

    await asyncio.gather(*(runner() for _ in range(concurrency)))


def worker_name(index: int) -> str:
    return f"fleet-w{index:05d}"


async def submit_fleet_jobs(server: harness.Server, args: argparse.Namespace, workers: int) -> None:
    """The fleet's running jobs, k per worker of ``gpus / k`` GPUs each, submitted before any host
    comes up (each host then claims its k)."""
    per_job = max(1, args.gpus // args.jobs_per_worker)
    total = workers * args.jobs_per_worker
    submit = await harness.HttpConn(server.host, server.port).connect()
    try:
        for start in range(0, total, 1000):
            count = min(1000, total - start)
            body = {
                "jobs": [
                    {
                        "command": "sleep 3600",
                        "name": f"running-{start + i}",
                        "resources": {"gpus": per_job, "cpus": 1},
                        "preemption_class": 10,
                    }
                    for i in range(count)
                ]
            }
            await submit.json(b"POST", "/jobs/batch", orjson.dumps(body), expect=201)
    finally:
        await submit.close()


#: the settings a simulated host reads (what a load process is handed of the command line)
HOST_SETTINGS = ("batched", "heartbeat_s", "worker_heartbeat_s", "gpus", "jobs_per_worker")
#: hosts brought up at once, in all load processes together (register, then claim)
BRING_UP_CONCURRENCY = 32


class LocalHosts:
    """Some of the fleet's simulated hosts (``indices``; host i talks to replica i mod R, as a load
    balancer would spread them) on this process's event loop. ``fleet.window``, while set, is the
    window their heartbeats are recorded in."""

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        args: argparse.Namespace,
        indices: Sequence[int],
        concurrency: int = BRING_UP_CONCURRENCY,
    ) -> None:
        self.addresses = list(addresses)
        self.args = args
        self.indices = list(indices)
        self.concurrency = max(1, min(concurrency, len(self.indices)))
        self.fleet = Fleet()
        self.conns: list[harness.HttpConn] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Bring each host up as a real worker comes up: register, claim its jobs (``max``: one
        request; a 503 is retried after a second, as the worker does), and start heartbeating at
        once, so no host sits silent while the rest of the fleet is set up (the reaper would flag
        it dead and reap its leases)."""
        args = self.args
        resources = {"gpus": args.gpus, "vram_mb": 81920, "memory_mb": 2_000_000, "cpus": 96}
        replicas = len(self.addresses)

        async def bring_up(position: int) -> None:
            index = self.indices[position]
            host, port = self.addresses[index % replicas]
            conn = harness.HttpConn(host, port)
            self.conns.append(conn)
            await conn.connect()
            name = worker_name(index)
            body = orjson.dumps(
                {"id": name, "address": f"10.0.{index // 250}.{index % 250}", "resources": resources}
            )
            await conn.json(b"POST", "/workers/register", body, expect=201)
            jobs: list[SimJob] = []
            while len(jobs) < args.jobs_per_worker:
                wanted = args.jobs_per_worker - len(jobs)
                status, content = await conn.request(b"GET", f"/jobs/next?worker_id={name}&max={wanted}")
                if status == 503:
                    await asyncio.sleep(1.0)
                    continue
                if status != 200:
                    raise harness.HttpError(f"worker {name}: claim answered {status} {content[:200]!r}")
                jobs.extend(SimJob(item["id"], item["attempt"]) for item in orjson.loads(content)["items"])
            self.tasks.append(
                asyncio.create_task(simulate_host(self.fleet, conn, name, jobs, args, index % replicas))
            )

        await _parallel(len(self.indices), bring_up, self.concurrency)

    def failure(self) -> BaseException | None:
        """The first host that stopped on an error (a host stops only on one)."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None

    async def stop(self) -> None:
        self.fleet.stopping = True
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for conn in self.conns:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await conn.close()


class InProcessLoad:
    """``--load-processes 1``: every host on the bench's own event loop, recording straight into
    the window (the load process's CPU: this whole process's, scrapes of ``/metrics`` included)."""

    count = 1

    def __init__(self, addresses: Sequence[tuple[str, int]], args: argparse.Namespace, workers: int) -> None:
        self.hosts = LocalHosts(addresses, args, range(workers))
        self._cpu = 0.0

    async def start(self) -> None:
        await self.hosts.start()

    async def open_window(self, window: Window) -> None:
        self._cpu = harness.self_cpu_seconds()
        self.hosts.fleet.window = window

    async def close_window(self, window: Window) -> None:
        self.hosts.fleet.window = None
        window.seconds = time.monotonic() - window.started
        window.driver_cpu = harness.self_cpu_seconds() - self._cpu
        window.driver_each_cpu = [window.driver_cpu]

    def raise_failure(self) -> None:
        failure = self.hosts.failure()
        if failure is not None:
            raise failure

    async def stop(self) -> None:
        await self.hosts.stop()


def window_share(window: Window) -> dict[str, object]:
    """What one load process's hosts recorded in a window, to merge in the parent's."""
    return {
        "job": window.job_latency,
        "worker": window.worker_latency,
        "statuses": {str(status): count for status, count in window.statuses.items()},
        "stale": window.stale,
        "lag": window.lag,
        "replica": {str(replica): values for replica, values in window.replica_latency.items()},
        "slow": window.slow_beats,
    }


def merge_share(window: Window, share: dict[str, Any]) -> None:
    """Add one load process's share to the window: the latencies and lags side by side (each host
    is in one share only), the counts summed. Send times are ``time.monotonic()``, one clock for
    every process on the machine, so the timeline lines them up as before."""
    window.job_latency.extend(share["job"])
    window.worker_latency.extend(share["worker"])
    for status, count in share["statuses"].items():
        window.statuses[int(status)] = window.statuses.get(int(status), 0) + count
    window.stale += share["stale"]
    window.lag.extend(share["lag"])
    for replica, values in share["replica"].items():
        window.replica_latency.setdefault(int(replica), []).extend(values)
    window.slow_beats.extend((sent, latency, replica) for sent, latency, replica in share["slow"])


class ProcessLoad:
    """``--load-processes N`` (N > 1): the hosts dealt round-robin to N child processes (host i to
    process i mod N, still talking to replica i mod R), each with its own event loop, so one
    interpreter's loop no longer sends every heartbeat (its lateness was part of the tail). Each
    child answers commands on its stdin with one JSON line on its stdout: ``open`` (start recording
    a window), ``close`` (stop, and send what was recorded and the CPU it spent), ``quit``."""

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        args: argparse.Namespace,
        workers: int,
        count: int,
        directory: Path,
    ) -> None:
        self.addresses = list(addresses)
        self.args = args
        self.workers = workers
        self.count = count
        self.directory = directory
        self.children: list[asyncio.subprocess.Process] = []
        self.logs: list[Path] = []
        self.failures: list[str] = []

    async def start(self) -> None:
        settings = {name: getattr(self.args, name) for name in HOST_SETTINGS}
        concurrency = max(1, BRING_UP_CONCURRENCY // self.count)
        for share in range(self.count):
            config = {
                "addresses": self.addresses,
                "settings": settings,
                "indices": [share, self.workers, self.count],
                "concurrency": concurrency,
            }
            self.logs.append(self.directory / f"load-{share}.log")
            log = self.logs[-1].open("wb")
            try:
                child = await asyncio.create_subprocess_exec(
                    harness.PYTHON,
                    str(THIS_FILE),
                    LOAD_AGENT,
                    orjson.dumps(config).decode(),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    limit=1 << 30,  # a window's latencies come as one line
                )
            finally:
                log.close()
            self.children.append(child)
        answers = await asyncio.gather(*(self._read(share) for share in range(self.count)))
        for share, answer in enumerate(answers):
            if "error" in answer:
                raise harness.HttpError(f"load process {share}: {answer['error']}")

    async def _read(self, share: int) -> dict[str, Any]:
        child = self.children[share]
        assert child.stdout is not None
        line = await child.stdout.readline()
        if not line:
            code = await child.wait()
            tail = self.logs[share].read_text(errors="replace")[-1500:]
            return {"error": f"exited ({code}) without answering; its stderr ends:\n{tail}"}
        answer: dict[str, Any] = orjson.loads(line)
        return answer

    async def _tell(self, command: bytes) -> None:
        for child in self.children:
            assert child.stdin is not None
            child.stdin.write(command + b"\n")
        await asyncio.gather(*(child.stdin.drain() for child in self.children if child.stdin is not None))

    async def open_window(self, window: Window) -> None:
        await self._tell(b"open")

    async def close_window(self, window: Window) -> None:
        await self._tell(b"close")
        window.seconds = time.monotonic() - window.started
        answers = await asyncio.gather(*(self._read(share) for share in range(self.count)))
        window.driver_each_cpu = []
        for share, answer in enumerate(answers):
            if "share" not in answer:
                raise harness.HttpError(f"load process {share}: {answer.get('error')}")
            merge_share(window, answer["share"])
            window.driver_each_cpu.append(answer["cpu"])
            if answer.get("failure"):
                self.failures.append(f"load process {share}: {answer['failure']}")
        window.driver_cpu = sum(window.driver_each_cpu)

    def raise_failure(self) -> None:
        if self.failures:
            raise harness.HttpError("; ".join(self.failures))

    async def stop(self) -> None:
        for child in self.children:
            if child.stdin is not None and child.returncode is None:
                with contextlib.suppress(Exception):
                    child.stdin.write(b"quit\n")
                    await child.stdin.drain()
                    child.stdin.close()
        for child in self.children:
            try:
                await asyncio.wait_for(child.wait(), 10)
            except TimeoutError:
                child.kill()
                await child.wait()


LOAD_AGENT = "--load-agent"
THIS_FILE = Path(__file__).resolve()


async def load_agent(config: dict[str, Any]) -> None:
    """One load process (``ProcessLoad``'s child): bring its hosts up, say so, then record windows
    as told on stdin until ``quit`` or the end of stdin (the parent gone)."""
    share, workers, step = config["indices"]
    hosts = LocalHosts(
        [(host, port) for host, port in config["addresses"]],
        argparse.Namespace(**config["settings"]),
        range(share, workers, step),
        config["concurrency"],
    )
    out = sys.stdout.buffer

    def answer(message: dict[str, Any]) -> None:
        out.write(orjson.dumps(message) + b"\n")
        out.flush()

    try:
        await hosts.start()
    except Exception as error:  # the parent prints it, with the servers' logs
        answer({"error": repr(error)})
        await hosts.stop()
        return
    answer({"ready": len(hosts.indices)})
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    window = Window("share")
    cpu = 0.0
    try:
        while command := (await reader.readline()).strip():
            if command == b"open":
                window = Window("share")
                cpu = harness.self_cpu_seconds()
                hosts.fleet.window = window
            elif command == b"close":
                hosts.fleet.window = None
                failure = hosts.failure()
                answer(
                    {
                        "share": window_share(window),
                        "cpu": harness.self_cpu_seconds() - cpu,
                        "failure": repr(failure) if failure is not None else None,
                    }
                )
            elif command == b"quit":
                break
    finally:
        await hosts.stop()


def default_load_processes() -> int:
    """A quarter of the machine's cores, 1 to 8: the servers, their planner processes and
    PostgreSQL need the rest (16 cores: 4 load processes, 2,500 of 10,000 hosts each; 2 cores:
    1, the bench as it always ran)."""
    return max(1, min(8, (os.cpu_count() or 1) // 4))


async def simulate_host(
    fleet: Fleet,
    conn: harness.HttpConn,
    worker_id: str,
    jobs: list[SimJob],
    args: argparse.Namespace,
    replica: int = 0,
) -> None:
    """One host: its job heartbeats every ``heartbeat_s`` and its own every ``worker_heartbeat_s``,
    in due order, one request at a time on its connection."""
    rng = random.Random(worker_id)
    now = time.monotonic()
    if args.batched:  # one worker heartbeat every heartbeat_s carrying every job's lease
        due = [(now + rng.uniform(0, args.heartbeat_s), -2)]
    else:
        due = [(now + rng.uniform(0, args.heartbeat_s), i) for i in range(len(jobs))]
        due.append((now + rng.uniform(0, args.worker_heartbeat_s), -1))
    gpus = [{"index": i, "util_pct": 95.0, "mem_used_mb": 60000} for i in range(args.gpus)]
    running = [job.id for job in jobs]
    while not fleet.stopping:
        due.sort()
        at, which = due[0]
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if fleet.stopping:
            return
        sent = time.monotonic()
        if which == -2:
            path = f"/workers/{worker_id}/heartbeat"
            beats = []
            for job in jobs:
                job.step += 1
                beats.append({"id": job.id, "attempt": job.attempt, "progress": {"step": job.step}})
            body = orjson.dumps({"gpus": gpus, "running": running, "jobs": beats})
            due[0] = (at + args.heartbeat_s, which)
        elif which < 0:
            path = f"/workers/{worker_id}/heartbeat"
            body = orjson.dumps({"gpus": gpus, "running": running})
            due[0] = (at + args.worker_heartbeat_s, which)
        else:
            job = jobs[which]
            job.step += 1
            path = f"/jobs/{job.id}/heartbeat?worker_id={worker_id}&attempt={job.attempt}"
            body = orjson.dumps({"progress": {"step": job.step}, "gpu_util_pct": 95.0, "rss_mb": 4096})
            due[0] = (at + args.heartbeat_s, which)
        status, content = await _send(conn, path, body)
        latency = time.monotonic() - sent
        window = fleet.window
        if window is None:
            continue
        window.lag.append(sent - at)
        window.statuses[status] = window.statuses.get(status, 0) + 1
        window.replica_latency.setdefault(replica, []).append(latency)
        if latency > SLOW_BEAT_S:
            window.slow_beats.append((sent, latency, replica))
        if which < 0:
            window.worker_latency.append(latency)
            if which == -2 and status == 200:
                answers = orjson.loads(content)["jobs"]
                window.stale += sum(1 for answer in answers.values() if "error" in answer)
        else:
            window.job_latency.append(latency)
            if status == 409:
                window.stale += 1


async def _send(conn: harness.HttpConn, path: str, body: bytes) -> tuple[int, bytes]:
    """POST on the host's connection; once more on a fresh one when the server had closed it (an
    idle keep-alive connection: what a real worker's transport does too)."""
    try:
        return await conn.request(b"POST", path, body)
    except (harness.HttpError, ConnectionError):
        await conn.close()
        return await conn.request(b"POST", path, body)


#: the lister, a process of its own so that reading 5 MB answers does not slow the load process's
#: event loop (and so its heartbeat timings): one line "<monotonic start> <seconds> <status>" per list
LISTER = """
import http.client, sys, time
host, port, every = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
paths = ["/jobs?limit=5000", "/workers"]
turn = 0
connection = http.client.HTTPConnection(host, port, timeout=60)
while True:
    started = time.monotonic()
    try:
        connection.request("GET", paths[turn % 2])
        answer = connection.getresponse()
        answer.read()
        status = answer.status
    except (OSError, http.client.HTTPException):
        connection.close()
        connection = http.client.HTTPConnection(host, port, timeout=60)
        continue
    print(started, time.monotonic() - started, status, flush=True)
    turn += 1
    time.sleep(max(0.0, every - (time.monotonic() - started)))
"""


def start_lister(
    processes: harness.Processes, server: harness.Server, every_s: float, directory: Path
) -> harness.Child:
    """Someone looking at the cluster: 5,000 jobs, then every worker, every ``every_s``."""
    argv = [harness.PYTHON, "-c", LISTER, server.host, str(server.port), str(every_s)]
    return processes.start("lister", argv, directory / f"lister-{server.port}.log")


def lister_latencies(child: harness.Child, window: Window, replica: int = 0) -> None:
    """The lists that started within the window (made on ``replica``)."""
    started_at = window.started
    for line in child.log.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        at, took, status = float(parts[0]), float(parts[1]), int(parts[2])
        if started_at <= at <= started_at + window.seconds and status == 200:
            window.list_latency.append(took)
            window.passes_seen.append((at, at + took, replica, "GET list"))


async def scrape(server: harness.Server) -> tuple[float, float, float]:
    """Admission passes, their seconds, and jobs reaped, from ``/metrics`` (a fresh connection: the
    server closes one idle for 5 s)."""
    conn = await harness.HttpConn(server.host, server.port).connect()
    try:
        _, text = await conn.request(b"GET", "/metrics")
    finally:
        await conn.close()
    metrics = text.decode()
    labels = '{loop="admission"}'
    reaped = sum(
        harness.metric(metrics, "corral_jobs_reaped_total", f'{{outcome="{outcome}"}}')
        for outcome in ("requeued", "failed")
    )
    return (
        harness.metric(metrics, "corral_scheduling_cycle_seconds_count", labels),
        harness.metric(metrics, "corral_scheduling_cycle_seconds_sum", labels),
        reaped,
    )


async def scrape_each(servers: list[harness.Server]) -> list[tuple[float, float, float]]:
    """``scrape`` of each replica (only the admission leader runs passes)."""
    return [await scrape(server) for server in servers]


def _summed(totals: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return sum(t[0] for t in totals), sum(t[1] for t in totals), sum(t[2] for t in totals)


async def watch_loops(servers: list[harness.Server], window: Window) -> None:
    """Poll each replica's ``/metrics`` every TIMELINE_POLL_S for its loops' pass counts and
    seconds: each pass seen is noted with when it was seen (it ended in the poll interval before)
    and how long it took, to set beside the slow heartbeats."""
    conns = [await harness.HttpConn(server.host, server.port).connect() for server in servers]
    last: list[dict[str, tuple[float, float]]] = [{} for _ in servers]
    try:
        while True:
            for replica, conn in enumerate(conns):
                _, text = await conn.request(b"GET", "/metrics")
                seen = time.monotonic()
                now: dict[str, list[float]] = {}
                for kind, loop, value in LOOP_COUNT.findall(text.decode()):
                    now.setdefault(loop, [0.0, 0.0])[0 if kind == "count" else 1] = float(value)
                for loop, (count, total) in now.items():
                    before = last[replica].get(loop)
                    if before is not None and count > before[0]:
                        start = seen - (total - before[1]) - TIMELINE_POLL_S
                        window.passes_seen.append((start, seen, replica, loop))
                    last[replica][loop] = (count, total)
            await asyncio.sleep(TIMELINE_POLL_S)
    finally:
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()


def print_timeline(window: Window) -> None:
    """The slow heartbeats beside the loop passes: for each loop, how many slow beats were in
    flight while one of its passes ran (on the same replica, or on another)."""
    if not window.slow_beats:
        print(f"         timeline ({window.name}): no heartbeat over {1e3 * SLOW_BEAT_S:.0f} ms")
        return
    overlap: dict[str, list[int]] = {}
    for start, end, replica, what in window.passes_seen:
        counts = overlap.setdefault(what, [0, 0, 0])
        counts[2] += 1
        for sent, latency, beat_replica in window.slow_beats:
            if sent < end and sent + latency > start:
                counts[0 if beat_replica == replica else 1] += 1
    alone = sum(
        1
        for sent, latency, _ in window.slow_beats
        if not any(sent < end and sent + latency > start for start, end, _, _ in window.passes_seen)
    )
    print(
        f"         timeline ({window.name}): {len(window.slow_beats)} heartbeats over"
        f" {1e3 * SLOW_BEAT_S:.0f} ms, {alone} of them during no pass or list"
    )
    for what, (same, other, passes) in sorted(overlap.items()):
        print(
            f"           {what:<18} {passes:>3} passes; slow beats in flight during one:"
            f" {same} on its replica, {other} on another"
        )
    print_slices(window)


#: ``--timeline``: the window cut into this many slices by send time for ``print_slices``
TIMELINE_SLICES = 5


def print_slices(window: Window) -> None:
    """Each replica's slowest heartbeat in each fifth of the window, by send time: a tail that
    falls slice after slice is a backlog draining (built before the window), one that stays is made
    within it."""
    seconds = window.seconds / TIMELINE_SLICES
    slowest: dict[int, list[float]] = {}
    for sent, latency, replica in window.slow_beats:
        index = min(TIMELINE_SLICES - 1, max(0, int((sent - window.started) / seconds)))
        row = slowest.setdefault(replica, [0.0] * TIMELINE_SLICES)
        row[index] = max(row[index], latency)
    for replica, row in sorted(slowest.items()):
        figures = " ".join(f"{1e3 * latency:>6.0f}" if latency else "     -" for latency in row)
        print(f"           replica {replica}: slowest beat (ms) sent in each {seconds:.0f}s of it: {figures}")


async def measure(
    load: InProcessLoad | ProcessLoad,
    window: Window,
    servers: list[harness.Server],
    seconds: float,
    postgres: bool,
    timeline: bool = False,
) -> Window:
    each_before = await scrape_each(servers)
    passes, cycle_s, reaped = _summed(each_before)
    pids = [server.child.process.pid for server in servers]
    cpu = [harness.cpu_seconds(pid, children=True) for pid in pids]  # with the planner process
    main_cpu = [harness.cpu_seconds(pid) for pid in pids]
    pg_before = harness.postgres_cpu_seconds() if postgres else {}
    backends = harness.postgres_backends_of(pids) if postgres else []
    window.load_average = os.getloadavg()[0]
    window.started = time.monotonic()
    await load.open_window(window)
    watcher = asyncio.create_task(watch_loops(servers, window)) if timeline else None
    await asyncio.sleep(seconds - (time.monotonic() - window.started))
    await load.close_window(window)
    if watcher is not None:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    window.replica_cpu = [
        harness.cpu_seconds(pid, children=True) - before for pid, before in zip(pids, cpu, strict=True)
    ]
    window.replica_main_cpu = [
        harness.cpu_seconds(pid) - before for pid, before in zip(pids, main_cpu, strict=True)
    ]
    window.server_cpu = sum(window.replica_cpu)
    if postgres:
        window.postgres_cpu = harness.postgres_cpu_delta(pg_before)
        after = {pid: harness.cpu_seconds(pid) for pid in backends if pid in pg_before}
        window.postgres_own_cpu = sum(
            value - pg_before[pid] for pid, value in after.items() if value == value
        )
    each_after = await scrape_each(servers)
    passes_after, cycle_after, reaped_after = _summed(each_after)
    window.replica_passes = [
        after[0] - before[0] for before, after in zip(each_before, each_after, strict=True)
    ]
    window.admission_passes = passes_after - passes
    window.admission_seconds = cycle_after - cycle_s
    window.reaped = reaped_after - reaped
    return window


async def submit_load(server: harness.Server, pending: int, gangs: int, gpus: int) -> tuple[float, float]:
    """Submit the load window's jobs in batches to ``server``; the seconds it took and those of the
    slowest batch."""
    conn = await harness.HttpConn(server.host, server.port).connect()
    started = time.monotonic()
    slowest = 0.0

    async def post(body: bytes) -> None:
        nonlocal slowest
        sent = time.monotonic()
        await conn.json(b"POST", "/jobs/batch", body, expect=201)
        slowest = max(slowest, time.monotonic() - sent)

    try:
        single = {"command": "true", "resources": {"gpus": 1, "cpus": 1}, "preemption_class": 10}
        for start in range(0, pending, 1000):
            count = min(1000, pending - start)
            await post(
                orjson.dumps({"jobs": [{**single, "name": f"pending-{start + i}"} for i in range(count)]})
            )
        gang = {
            "command": "true",
            "gang_size": 4,
            "resources": {"gpus": gpus, "cpus": 8},
            "preemption_class": 10,
        }
        for start in range(0, gangs, 250):
            count = min(250, gangs - start)
            await post(orjson.dumps({"jobs": [{**gang, "name": f"gang-{start + i}"} for i in range(count)]}))
    finally:
        await conn.close()
    return time.monotonic() - started, slowest


LEADER = re.compile(r'^corral_loop_leader\{loop="([a-z_]+)"\} ([0-9.e+-]+)$', re.MULTILINE)


async def pick_front(servers: list[harness.Server]) -> tuple[int, str]:
    """The replica the bench's own submits and lists go to, and why: with several, one that leads
    no loop, or the fewest (never admission when another can take them), read from each one's
    ``corral_loop_leader`` gauges; the last such. An operator's CLI and dashboards reach any replica
    behind a load balancer: sending them all to the admission leader (as this bench did, to the
    first replica) loads that one with work a real fleet spreads, and its heartbeats' tail with it."""
    if len(servers) == 1:
        return 0, "the only server"
    led: list[list[str]] = []
    for server in servers:
        conn = await harness.HttpConn(server.host, server.port).connect()
        try:
            _, text = await conn.request(b"GET", "/metrics")
        finally:
            await conn.close()
        led.append([loop for loop, value in LEADER.findall(text.decode()) if float(value) == 1])
    front = min(range(len(servers)), key=lambda i: ("admission" in led[i], len(led[i]), -i))
    leading = ", ".join(f"replica {i}: {'+'.join(loops)}" for i, loops in enumerate(led) if loops)
    return front, f"loops led: {leading or 'none yet'}"


async def bench_fleet(
    servers: list[harness.Server],
    args: argparse.Namespace,
    workers: int,
    processes: harness.Processes,
    directory: Path,
) -> tuple[list[Window], int]:
    """The idle and load windows of one fleet size, and the replica the bench's own requests went
    to."""
    for replica in servers:
        probe = await harness.HttpConn(replica.host, replica.port).connect()
        await harness.wait_ready(probe)
        await probe.close()
    started = time.monotonic()
    front, why = await pick_front(servers)
    await submit_fleet_jobs(servers[front], args, workers)
    addresses = [(replica.host, replica.port) for replica in servers]
    count = min(args.load_processes, workers)
    load: InProcessLoad | ProcessLoad = (
        ProcessLoad(addresses, args, workers, count, directory)
        if count > 1
        else InProcessLoad(addresses, args, workers)
    )
    listing: harness.Child | None = None
    postgres = args.db == "postgres"
    try:
        await load.start()
        print(
            f"  set up {workers} workers x {args.gpus} GPUs, {workers * args.jobs_per_worker} running jobs"
            f" in {time.monotonic() - started:.1f}s, from {count} load process(es)",
            flush=True,
        )
        await asyncio.sleep(args.settle_s)
        idle = await measure(load, Window("idle"), servers, args.window_s, postgres, args.timeline)
        print(f"  {glance(idle)}", flush=True)
        front, why = await pick_front(servers)  # leadership settled by now
        server = servers[front]
        if len(servers) > 1:
            print(f"  submits and lists go to replica {front} ({why})", flush=True)
        submitting = asyncio.create_task(submit_load(server, args.pending, args.gangs, args.gpus))
        if args.submit_window:
            # the heartbeats while the load is submitted (its first --window-s), on every replica
            during = await measure(load, Window("submit"), servers, args.window_s, postgres, args.timeline)
            print(f"  {glance(during)}; by replica {_by_replica(during)}", flush=True)
            if args.timeline:
                print_slices(during)
        loaded, slowest = await submitting
        print(
            f"  submitted {args.pending} pending jobs and {args.gangs} gangs in {loaded:.1f}s"
            f" (slowest request {slowest:.1f}s)",
            flush=True,
        )
        if args.list_every_s > 0:
            listing = start_lister(processes, server, args.list_every_s, directory)
        await asyncio.sleep(min(args.settle_s, 5.0))
        spy = None
        if args.profile:
            leader = max(range(len(servers)), key=lambda i: idle.replica_passes[i])
            out = directory / f"pyspy-{servers[leader].port}.txt"
            spy = harness.start_pyspy(processes, servers[leader].child.process.pid, out, gil=True)
        loaded_window = await measure(load, Window("load"), servers, args.window_s, postgres, args.timeline)
        if spy is not None:
            harness.stop_pyspy(processes, spy)
            harness.print_collapsed(out, title="server (GIL holder)")
        if listing is not None:
            lister_latencies(listing, loaded_window, front)
        load.raise_failure()
    finally:
        if listing is not None:
            processes.stop(listing, grace_s=1)
        await load.stop()
    return [idle, loaded_window], front


def _ms(values: Sequence[float], q: float) -> float:
    return 1e3 * harness.percentile(values, q) if values else float("nan")


def report(workers: int, args: argparse.Namespace, windows: list[Window], front: int = 0) -> None:
    replicas = f", {args.replicas} replicas" if args.replicas > 1 else ""
    harness.banner(
        f"fleet on {args.db}{replicas}: {workers} workers x {args.gpus} GPUs,"
        f" {args.jobs_per_worker} running job(s)"
        + (
            f" each; batched: one worker heartbeat with every job's lease every {args.heartbeat_s:g}s"
            if args.batched
            else f" each; job heartbeat {args.heartbeat_s:g}s, worker heartbeat {args.worker_heartbeat_s:g}s"
        )
    )
    rate = workers * (args.jobs_per_worker / args.heartbeat_s + 1 / args.worker_heartbeat_s)
    if args.batched:
        rate = workers / args.heartbeat_s
    print(
        f"  offered heartbeat rate {rate:.0f} req/s; load window: {args.pending} pending, {args.gangs} gangs,"
    )
    print(f"  GET /jobs?limit=5000 and GET /workers alternately every {args.list_every_s:g}s", end="")
    print(f"; submits and lists on replica {front}" if args.replicas > 1 else "")
    loads = len(windows[0].driver_each_cpu)
    print(f"  hosts simulated by {loads} load process(es), host i in process i mod {loads}")
    print(
        f"  {'window':<6} {'beats':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        f" {'job p99':>8} {'wrk p99':>8} {'srv CPU':>8} {'adm passes':>10} {'adm ms':>7}"
        f" {'missed':>6} {'list p50':>9} {'list max':>9} {'lag max':>8}"
    )
    for window in windows:
        beats = window.heartbeats
        cpu = 100 * window.server_cpu / window.seconds if window.seconds else float("nan")
        adm = 1e3 * window.admission_seconds / window.admission_passes if window.admission_passes else 0.0
        missed = window.stale + int(window.reaped)
        print(
            f"  {window.name:<6} {len(beats):>7} {_ms(beats, 50):>8.1f} {_ms(beats, 99):>8.1f}"
            f" {1e3 * max(beats, default=float('nan')):>8.1f} {_ms(window.job_latency, 99):>8.1f}"
            f" {_ms(window.worker_latency, 99):>8.1f} {cpu:>7.0f}% {window.admission_passes:>10.0f}"
            f" {adm:>7.0f} {missed:>6} {_ms(window.list_latency, 50):>9.0f}"
            f" {1e3 * max(window.list_latency, default=float('nan')):>9.0f}"
            f" {1e3 * max(window.lag, default=float('nan')):>8.0f}"
        )
        failures = {status: count for status, count in window.statuses.items() if status != 200}
        extra = f"answers other than 200: {failures}" if failures else ""
        if len(window.replica_cpu) > 1:
            shares = " + ".join(f"{100 * cpu / window.seconds:.0f}%" for cpu in window.replica_cpu)
            extra += f"  replicas' CPU {shares}"
        mains = " + ".join(f"{100 * cpu / window.seconds:.0f}%" for cpu in window.replica_main_cpu)
        extra += f"  (their main processes alone, no planner or reader: {mains})"
        if window.postgres_cpu == window.postgres_cpu:
            extra += (
                f"  PostgreSQL CPU {100 * window.postgres_cpu / window.seconds:.0f}%"
                f" (this bench's backends {100 * window.postgres_own_cpu / window.seconds:.0f}%)"
            )
        extra += f"  load process CPU {100 * window.driver_cpu / window.seconds:.0f}%"
        if len(window.driver_each_cpu) > 1:
            busiest = max(window.driver_each_cpu)
            extra += f" (all {len(window.driver_each_cpu)}; busiest {100 * busiest / window.seconds:.0f}%)"
        extra += f"  load average {window.load_average:.1f}"
        print(f"         {extra.strip()}")
        if len(window.replica_cpu) > 1:
            print(f"         heartbeat p99 / max by replica: {_by_replica(window)}")
        if args.timeline:
            print_timeline(window)
    idle, load = windows
    ratio = _ms(load.heartbeats, 99) / _ms(idle.heartbeats, 99)
    print(harness.figure("heartbeat p99 load / idle", ratio, "x", TARGET_P99_RATIO, at_least=False))


def glance(window: Window) -> str:
    """A window's figures in one line, printed as soon as it is measured: a run that passes its
    bound later (a fleet too large for its replicas) still leaves them."""
    beats = window.heartbeats
    mains = " + ".join(f"{100 * cpu / window.seconds:.0f}%" for cpu in window.replica_main_cpu)
    return (
        f"{window.name} window: {len(beats)} heartbeats, p50 / p99 / max {_ms(beats, 50):.1f} /"
        f" {_ms(beats, 99):.1f} / {1e3 * max(beats, default=float('nan')):.1f} ms, missed"
        f" {window.stale + int(window.reaped)}, main processes {mains},"
        f" lag max {1e3 * max(window.lag, default=float('nan')):.0f} ms"
    )


def _by_replica(window: Window) -> str:
    """Each replica's heartbeat p99 / max in ms, the one that ran admission passes marked."""
    parts = []
    for replica in sorted(window.replica_latency):
        latencies = window.replica_latency[replica]
        passes = window.replica_passes[replica] if replica < len(window.replica_passes) else 0
        leader = f" ({passes:.0f} passes)" if passes else ""
        parts.append(f"{_ms(latencies, 99):.1f} / {1e3 * max(latencies):.1f}{leader}")
    return " | ".join(parts)


def record(
    workers: int, args: argparse.Namespace, windows: list[Window], front: int = 0
) -> dict[str, object]:
    """One size's windows as JSON for ``--json`` (what ``bench/fleet_fit.py`` reads): CPU in
    seconds over each window's ``seconds``, latencies in ms. ``driver_cpu_s`` is every load
    process's together (the client's cost), ``driver_each_cpu_s`` each one's (one near a core:
    the client saturated)."""

    def one(window: Window) -> dict[str, object]:
        beats = window.heartbeats
        return {
            "name": window.name,
            "seconds": window.seconds,
            "beats": len(beats),
            "p50_ms": _ms(beats, 50),
            "p99_ms": _ms(beats, 99),
            "max_ms": 1e3 * max(beats, default=float("nan")),
            "lag_max_ms": 1e3 * max(window.lag, default=float("nan")),
            "missed": window.stale + int(window.reaped),
            "failures": {str(status): count for status, count in window.statuses.items() if status != 200},
            "server_cpu_s": window.server_cpu,
            "replica_cpu_s": window.replica_cpu,
            "replica_main_cpu_s": window.replica_main_cpu,
            "postgres_cpu_s": window.postgres_cpu,
            "postgres_own_cpu_s": window.postgres_own_cpu,
            "driver_cpu_s": window.driver_cpu,
            "driver_each_cpu_s": window.driver_each_cpu,
            "load_average": window.load_average,
            "admission_passes": window.admission_passes,
            "admission_seconds": window.admission_seconds,
            "replica_p99_ms": [
                _ms(window.replica_latency.get(i, []), 99) for i in range(len(window.replica_cpu))
            ],
            "replica_passes": window.replica_passes,
        }

    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "db": args.db,
        "replicas": args.replicas,
        "workers": workers,
        "jobs_per_worker": args.jobs_per_worker,
        "batched": args.batched,
        "heartbeat_s": args.heartbeat_s,
        "cores": os.cpu_count(),
        "load_processes": len(windows[0].driver_each_cpu),
        "front_replica": front,
        "windows": [one(window) for window in windows],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [LOAD_AGENT]:  # one of ProcessLoad's children
        harness.new_event_loop_policy()
        asyncio.run(load_agent(orjson.loads(argv[1])))
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="500,2000", help="comma list of fleet sizes N")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg-url", default=harness.DEFAULT_PG_URL)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per worker")
    parser.add_argument("--jobs-per-worker", type=int, default=1, help="running jobs per worker (k)")
    parser.add_argument("--heartbeat-s", type=float, default=5.0, help="job heartbeat interval")
    parser.add_argument("--worker-heartbeat-s", type=float, default=15.0, help="worker heartbeat interval")
    parser.add_argument("--pending", type=int, default=20_000, help="pending single jobs in the load window")
    parser.add_argument(
        "--gangs", type=int, default=500, help="blocked gangs (4 x all GPUs) in the load window"
    )
    parser.add_argument("--list-every-s", type=float, default=2.0, help="0: nobody lists")
    parser.add_argument(
        "--submit-window",
        action="store_true",
        help="also measure the heartbeats during the load's submit (its first --window-s; not in --json)",
    )
    parser.add_argument("--window-s", type=float, default=20.0, help="length of each measuring window")
    parser.add_argument("--settle-s", type=float, default=6.0, help="warm-up before the idle window")
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for corral server")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--batched",
        action="store_true",
        help="each host sends one worker heartbeat every --heartbeat-s carrying all its jobs' leases",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="server processes on the one store (PostgreSQL only); host i talks to replica i mod R",
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="poll each replica's loop passes and set them beside the heartbeats over 50 ms",
    )
    parser.add_argument(
        "--json", type=Path, help="append one JSON line per size to this file (bench/fleet_fit.py reads it)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the server's GIL holder during the load window"
    )
    parser.add_argument(
        "--load-processes",
        type=int,
        default=default_load_processes(),
        help="processes simulating the hosts, host i in process i mod P (default: a quarter of the"
        " cores, 1 to 8; 1: every host on the bench's own event loop, as it always ran)",
    )
    args = parser.parse_args(argv)
    if args.load_processes < 1:
        parser.error("--load-processes: at least 1")
    if args.replicas < 1 or (args.replicas > 1 and args.db != "postgres"):
        parser.error("--replicas: 1, or more on PostgreSQL (one server per SQLite file)")
    sizes = [int(part) for part in args.workers.split(",") if part.strip()]

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(sizes) + 256
    if soft < wanted:  # the server inherits it: one connection per simulated worker
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(wanted, soft)), hard))
    machine.print_machine()
    if args.db == "postgres":
        print(f"  postgres {harness.postgres_version(args.pg_url)} at {args.pg_url}")
    harness.new_event_loop_policy()
    processes = harness.Processes()
    failed = False
    try:
        with harness.bounded(args.timeout), harness.workdir(args.keep) as directory:
            for workers in sizes:
                here = directory / f"fleet-{workers}"  # a fresh store (and logs) per size
                here.mkdir()
                with harness.store_url(args.db, here, args.pg_url) as db_url:
                    # N hosts from one address: the per-client caps (256 requests, 256
                    # connections) are for one NAT address of a real fleet, not for this load
                    # process standing in for N of them
                    share = str(max(256, 4 * workers))
                    limit = ["--max-requests-per-client", share, "--max-connections-per-client", share]
                    servers = []
                    for replica in range(args.replicas):
                        place = here / f"replica-{replica}" if args.replicas > 1 else here
                        place.mkdir(exist_ok=True)
                        servers.append(
                            harness.start_server(processes, db_url, place, [*limit, *args.server_arg])
                        )
                    try:
                        windows, front = asyncio.run(bench_fleet(servers, args, workers, processes, here))
                    except (harness.HttpError, OSError, TimeoutError) as error:
                        print(f"\nfleet of {workers} FAILED: {error!r}", flush=True)
                        for server in servers:
                            tail = server.child.log.read_text(errors="replace")[-2000:]
                            print(f"  server log tail ({server.url}):\n{tail}")
                        failed = True
                        continue
                    finally:
                        for server in servers:
                            processes.stop(server.child)
                    report(workers, args, windows, front)
                    if args.json is not None:
                        with args.json.open("ab") as out:
                            out.write(orjson.dumps(record(workers, args, windows, front)) + b"\n")
    except KeyboardInterrupt:
        print("interrupted; processes stopped", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
