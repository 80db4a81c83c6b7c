"""The cost of open log follows: N ``GET /jobs/{id}/logs?follow=1`` streams on one pending job.

Issue 24's probe held 200 follows on a job that never started: they never ended and took 76% of a
core, each polling the store four times a second. Follows now share one poll per job
(``corral.server.log_watch``) and wake only when there is something for them. This opens
``--streams`` follows (default 1,000) of one job no worker will run, against the real
``corral server``, measures the server's CPU first with none open (``--baseline-s``) and then with
all of them open (``--seconds``, default 30), and last cancels the job: every follow must end.

    .venv/bin/python bench/streams.py [--streams 1000] [--seconds 30] [--db sqlite|postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time

import harness
import machine

TARGET_PCT = 10.0


class Follow:
    """One raw follow: the request sent, the answer's head read; then its body is drained."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self.host, self.port, self.path = host, port, path
        self.status = 0
        self.ended = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(f"GET {self.path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        self.status = int(head[9:12])
        self.task = asyncio.create_task(self._drain(reader, writer))

    async def _drain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read the chunked body until its last chunk (the server keeps the connection after it)."""
        try:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    break
                await reader.readexactly(size + 2)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self.ended.set()
            writer.close()


async def run(host: str, port: int, pid: int, args: argparse.Namespace) -> bool:
    conn = await harness.HttpConn(host, port).connect()
    job = await conn.json(b"POST", "/jobs", b'{"command": "true", "resources": {"gpus": 1}}', expect=201)
    path = f"/jobs/{job['id']}/logs?follow=1"

    before = harness.cpu_seconds(pid)
    await asyncio.sleep(args.baseline_s)
    idle_pct = 100 * (harness.cpu_seconds(pid) - before) / args.baseline_s

    follows = [Follow(host, port, path) for _ in range(args.streams)]
    opened_at = time.perf_counter()
    for start in range(0, len(follows), 100):
        await asyncio.gather(*(follow.open() for follow in follows[start : start + 100]))
    open_s = time.perf_counter() - opened_at
    statuses = {follow.status for follow in follows}
    await asyncio.sleep(1.0)  # past the opening burst

    before = harness.cpu_seconds(pid)
    await asyncio.sleep(args.seconds)
    streams_pct = 100 * (harness.cpu_seconds(pid) - before) / args.seconds
    still_open = sum(1 for follow in follows if not follow.ended.is_set())

    cancelled_at = time.perf_counter()
    await conn.close()  # idle past the server's idle timeout meanwhile: a fresh connection
    await conn.json(b"POST", f"/jobs/{job['id']}/cancel", b"{}")
    done, _ = await asyncio.wait([asyncio.create_task(follow.ended.wait()) for follow in follows], timeout=30)
    end_s = time.perf_counter() - cancelled_at
    await conn.close()

    harness.banner(f"{args.streams} follows of one pending job ({args.db})")
    print(f"  opened in {open_s:.1f} s, statuses {sorted(statuses)}")
    print(harness.figure("server CPU, no follow open", idle_pct, "% of a core"))
    print(
        harness.figure(
            f"server CPU, {args.streams} follows open", streams_pct, "% of a core", TARGET_PCT, False
        )
    )
    print(harness.figure("follows open through the window", still_open, "streams"))
    print(harness.figure("follows ended after the cancel", len(done), "streams"))
    print(f"  all ended within {end_s:.2f} s of the cancel")
    return statuses == {200} and still_open == args.streams and len(done) == args.streams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg-url", default=harness.DEFAULT_PG_URL)
    parser.add_argument("--streams", type=int, default=1000, help="follows to open")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window with them open")
    parser.add_argument("--baseline-s", type=float, default=10.0, help="measured window before")
    parser.add_argument("--timeout", type=float, default=300.0, help="hard bound on the whole run (s)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (server log)")
    args = parser.parse_args(argv)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.streams + 256
    if soft < wanted:  # this process holds one socket per follow
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted), hard))
    machine.print_machine()
    harness.new_event_loop_policy()
    processes = harness.Processes()
    # every follow comes from this one address: raise the per-client caps past them
    share = str(args.streams + 64)
    limits = ["--max-connections-per-client", share, "--max-requests-per-client", share]
    try:
        with (
            harness.bounded(args.timeout),
            harness.workdir(args.keep) as directory,
            harness.store_url(args.db, directory, args.pg_url) as db_url,
        ):
            server = harness.start_server(processes, db_url, directory, limits)
            try:
                passed = asyncio.run(run(server.host, server.port, server.child.process.pid, args))
            finally:
                processes.stop_all()
    except KeyboardInterrupt:
        print("interrupted; processes stopped", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
