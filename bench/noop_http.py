"""The HTTP ceiling: requests/s of a no-op route (``GET /healthz``) on the real corral server.

Same client technique as ``bench/protocol.py`` (raw keep-alive HTTP/1.1 over asyncio streams, one
connection per simulated worker, all in this one process), so the figure is the ceiling the protocol
benchmark is read against: a job needs ``2 + 1/batch`` requests, so the protocol can at best reach
``ceiling / (2 + 1/batch)`` jobs/s. ``protocol.py`` calls ``measure_noop`` on its own server so both
figures come from the same server in one run.

    .venv/bin/python bench/noop_http.py [--db sqlite|postgres] [--connections 8] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass

import harness
import machine


@dataclass
class NoopResult:
    requests_per_s: float
    server_cpu_per_request_ms: float  # nan when the server's pid was not given


async def measure_noop(
    host: str,
    port: int,
    connections: int = 8,
    seconds: float = 3.0,
    warmup_s: float = 0.5,
    path: str = "/healthz",
) -> float:
    """Requests/s of ``GET path`` over ``connections`` keep-alive connections, each one request at a time."""
    return (await measure_noop_detailed(host, port, connections, seconds, warmup_s, path)).requests_per_s


async def measure_noop_detailed(
    host: str,
    port: int,
    connections: int = 8,
    seconds: float = 3.0,
    warmup_s: float = 0.5,
    path: str = "/healthz",
    server_pid: int | None = None,
) -> NoopResult:
    """``measure_noop`` plus the server's CPU per request (from ``/proc``) when ``server_pid`` is given."""
    conns = [await harness.HttpConn(host, port).connect() for _ in range(connections)]
    counts = [0] * connections
    failures = [0]
    stop = asyncio.Event()

    async def loop(index: int, conn: harness.HttpConn) -> None:
        request = conn.request
        while not stop.is_set():
            status, _ = await request(b"GET", path)
            if status != 200:
                failures[0] += 1
            counts[index] += 1

    tasks = [asyncio.create_task(loop(index, conn)) for index, conn in enumerate(conns)]
    gathered = asyncio.gather(*tasks)
    cpu = float("nan")
    try:
        await asyncio.sleep(warmup_s)
        before, started = sum(counts), time.perf_counter()
        cpu_before = harness.cpu_seconds(server_pid) if server_pid else float("nan")
        await asyncio.sleep(seconds)
        after, ended = sum(counts), time.perf_counter()
        cpu = (harness.cpu_seconds(server_pid) if server_pid else float("nan")) - cpu_before
        stop.set()
        await asyncio.wait_for(gathered, 10)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await gathered  # retrieved, so asyncio does not warn about it at exit
        for conn in conns:
            await conn.close()
    if failures[0]:
        raise harness.HttpError(f"{failures[0]} no-op requests did not answer 200")
    return NoopResult((after - before) / (ended - started), 1e3 * cpu / max(1, after - before))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--db", choices=["sqlite", "postgres"], default="sqlite", help="store behind the server"
    )
    parser.add_argument("--pg-url", default=harness.DEFAULT_PG_URL)
    parser.add_argument("--connections", type=int, default=8, help="concurrent keep-alive connections")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window (after 0.5 s warm-up)")
    parser.add_argument(
        "--batch", type=int, default=1000, help="batch size used to derive the protocol bound"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="hard bound on the whole run (s)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (server log)")
    args = parser.parse_args(argv)

    machine.print_machine()
    harness.new_event_loop_policy()
    processes = harness.Processes()
    try:
        with (
            harness.bounded(args.timeout),
            harness.workdir(args.keep) as directory,
            harness.store_url(args.db, directory, args.pg_url) as db_url,
        ):
            server = harness.start_server(processes, db_url, directory)
            try:
                result = asyncio.run(
                    asyncio.wait_for(
                        measure_noop_detailed(
                            server.host,
                            server.port,
                            args.connections,
                            args.seconds,
                            server_pid=server.child.process.pid,
                        ),
                        args.seconds + 30,
                    )
                )
            finally:
                processes.stop_all()
        per_job = 2 + 1 / args.batch
        harness.banner(f"no-op HTTP ceiling ({args.db}, {args.connections} connections, GET /healthz)")
        rate = result.requests_per_s
        print(harness.figure("requests/s", rate, "req/s"))
        print(harness.figure("server CPU per request", 1e3 * result.server_cpu_per_request_ms, "us"))
        print(harness.figure(f"protocol bound: ceiling / {per_job:g} req per job", rate / per_job, "jobs/s"))
    except KeyboardInterrupt:
        print("interrupted; processes stopped", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
