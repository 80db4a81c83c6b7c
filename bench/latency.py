"""Submit-to-start latency on an idle cluster: one real worker, idle and long-polling.

``--samples`` times: submit one job (``POST /jobs``) whose command records when it started,
``date +%s.%N > FILE`` (``/bin/sh -c`` then ``date``: no interpreter start-up in the figure), wait
until it is ``done``, pause ``--gap-s`` so the worker is idle and long-polling again, then the next.
For each sample, with ``sent`` the time the submit request was written to the socket (all clocks
are this machine's wall clock):

- command start: the time ``date`` printed minus ``sent`` (the figure the target is about);
- claimed: the job's ``started_at`` (the server's claim time, millisecond precision) minus ``sent``;
- claim -> command: command start minus ``started_at`` (the worker's share);
- file mtime: the output file's modification time minus ``sent`` (a cross-check of the ``date``
  figure, independent of ``date`` itself; the kernel stamps it with a coarse clock).

    .venv/bin/python bench/latency.py [--samples 200] [--db sqlite|postgres] [--gap-s 0.05]

Target (2-core machine): p50 of command start < 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import orjson

import harness
import machine

TARGET_P50_MS = 20.0


def _started(path: Path) -> bool:
    """The command has run: ``date``'s one line is in the file (the shell creates it empty first)."""
    try:
        return os.stat(path).st_size > 0
    except FileNotFoundError:
        return False


async def sample_all(
    args: argparse.Namespace, server: harness.Server, worker_id: str, processes: harness.Processes, out: Path
) -> dict[str, list[float]]:
    conn = await harness.HttpConn(server.host, server.port).connect()
    poll = await harness.HttpConn(server.host, server.port).connect()
    await harness.wait_workers(conn, [worker_id], processes)
    await asyncio.sleep(max(args.gap_s, 0.5))
    figures: dict[str, list[float]] = {"command": [], "claimed": [], "worker": [], "mtime": []}
    for index in range(args.samples):
        path = out / f"{index}.start"
        body = orjson.dumps({"command": f"date +%s.%N > {path}", "name": f"latency-{index}"})
        sent = time.time()
        job = await conn.json(b"POST", "/jobs", body, expect=201)

        deadline = time.monotonic() + args.sample_timeout_s
        while not _started(path):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"sample {index}: the command did not start within {args.sample_timeout_s}s"
                )
            await asyncio.sleep(0.0005)
        while True:
            final = await poll.json(b"GET", f"/jobs/{job['id']}")
            if final["status"] in ("done", "failed", "cancelled"):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"sample {index}: the job did not end within {args.sample_timeout_s}s")
            await asyncio.sleep(0.002)
        if final["status"] != "done":
            raise RuntimeError(f"sample {index} ended {final['status']}: {final.get('error')}")
        command_at = float(path.read_text().strip())
        claimed_at = harness.parse_time(str(final["started_at"]))
        assert claimed_at is not None
        figures["command"].append(1e3 * (command_at - sent))
        figures["claimed"].append(1e3 * (claimed_at - sent))
        figures["worker"].append(1e3 * (command_at - claimed_at))
        figures["mtime"].append(1e3 * (os.stat(path).st_mtime_ns / 1e9 - sent))
        await asyncio.sleep(args.gap_s)
    await conn.close()
    await poll.close()
    return figures


def summary(label: str, values: list[float], target: float | None = None) -> None:
    p50, p99 = harness.percentile(values, 50), harness.percentile(values, 99)
    print(harness.figure(f"{label} p50", p50, "ms", target, at_least=False))
    print(harness.figure(f"{label} p99", p99, "ms"))
    spread = f"min {min(values):.1f}  mean {statistics.fmean(values):.1f}  max {max(values):.1f} ms"
    print(f"  {'':<48} {spread}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--gap-s", type=float, default=0.05, help="idle pause between samples")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg-url", default=harness.DEFAULT_PG_URL)
    parser.add_argument("--cpus", type=int, default=4, help="--cpus of the worker")
    parser.add_argument("--heartbeat-s", type=float, default=1.0, help="--heartbeat-s of the worker")
    parser.add_argument("--sample-timeout-s", type=float, default=10.0, help="bound on one sample")
    parser.add_argument("--timeout", type=float, default=180.0, help="bound on the whole run (s)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for corral server")
    parser.add_argument("--worker-arg", action="append", default=[], help="extra flag for corral worker")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, files)")
    args = parser.parse_args(argv)

    machine.print_machine()
    available, why = harness.worker_available()
    if not available:
        print(f"\npython -m corral worker is not available yet; nothing measured:\n{why}")
        return 2
    harness.new_event_loop_policy()
    processes = harness.Processes()
    try:
        with harness.bounded(args.timeout), harness.workdir(args.keep) as directory:
            out = directory / "starts"
            out.mkdir()
            with harness.store_url(args.db, directory, args.pg_url) as db_url:
                server = harness.start_server(processes, db_url, directory, args.server_arg)
                worker_id = "bench-latency-0"
                harness.start_worker(
                    processes, server.url, worker_id, directory, args.cpus, args.heartbeat_s, args.worker_arg
                )
                try:
                    figures = asyncio.run(sample_all(args, server, worker_id, processes, out))
                finally:
                    processes.stop_all()
        harness.banner(
            f"submit-to-start latency on {args.db}: {args.samples} samples, 1 idle long-polling worker,"
            f" command 'date +%s.%N > file'"
        )
        summary("submit -> command start (date)", figures["command"], TARGET_P50_MS)
        summary("submit -> claimed (started_at, 1 ms res.)", figures["claimed"])
        summary("claimed -> command start (worker)", figures["worker"])
        summary("submit -> file mtime (coarse clock)", figures["mtime"])
    except KeyboardInterrupt:
        print("interrupted; processes stopped", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
