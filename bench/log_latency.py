"""How soon a follower sees a line a job wrote: measured with a real server, worker and follow.

The job is a small Python writer that writes one line every ``--every-ms`` (100) for
``--seconds`` (20), each line carrying the wall-clock time it was written. A reader holds
``GET /jobs/{id}/logs?follow=1`` open against the real server (what ``corral logs -f`` does) and
notes, for each line, when it arrived; the latency of a line is its arrival less its write (the
same host: the same clock). The worker runs with the default job heartbeat (``--heartbeat-s`` 5),
as a new user's would: the shipper used to hold small output until the next heartbeat.

Printed: the machine, the lines written and received (all must arrive, in order), and the
write-to-delivery latency p50 / p99 / max.

    .venv/bin/python bench/log_latency.py [--every-ms 100] [--seconds 20] [--db sqlite|postgres]

Target: p50 under 1 s (issue 23: output came in bursts about every 5 s).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import httpx

import harness
import machine
from corral.client import Client

TARGET_P50_S = 1.0

WRITER = r"""
import os, sys, time
every, count = float(sys.argv[1]), int(sys.argv[2])
start = time.monotonic()
for number in range(count):
    due = start + number * every
    pause = due - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    os.write(1, b"%d %.6f\n" % (number, time.time()))
"""


def follow(url: str, job_id: str, arrivals: list[tuple[int, float, float]], done: threading.Event) -> None:
    """Read the job's follow stream to its end; note (number, written, arrived) for each line."""
    try:
        with httpx.stream("GET", f"{url}/jobs/{job_id}/logs", params={"follow": "1"}, timeout=120) as answer:
            answer.raise_for_status()
            for line in answer.iter_lines():
                arrived = time.time()
                if not line.strip():
                    continue
                number, written = line.split()
                arrivals.append((int(number), float(written), arrived))
    finally:
        done.set()


def run(args: argparse.Namespace) -> int:
    machine.print_machine()
    count = int(args.seconds * 1000 / args.every_ms)
    processes = harness.Processes()
    arrivals: list[tuple[int, float, float]] = []
    with harness.workdir(args.keep) as directory, harness.store_url(args.db, directory) as db_url:
        (directory / "writer.py").write_text(WRITER)
        try:
            server = harness.start_server(processes, db_url, directory)
            harness.start_worker(processes, server.url, "latency-1", directory, cpus=4, heartbeat_s=5.0)
            with Client(server.url) as client:
                deadline = time.monotonic() + 30
                while not client.workers():
                    if time.monotonic() > deadline:
                        raise RuntimeError("the worker did not register")
                    time.sleep(0.1)
                command = f"{sys.executable} {directory / 'writer.py'} {args.every_ms / 1000} {count}"
                job = client.submit_body({"command": command, "resources": {"cpus": 1}})
                done = threading.Event()
                reader = threading.Thread(target=follow, args=(server.url, job["id"], arrivals, done))
                reader.start()
                if not done.wait(args.seconds + 120):
                    raise RuntimeError("the follow did not end")
                reader.join()
                final = client.get_job(job["id"])
        except harness.BenchTimeout as error:
            print(f"stopped: {error}", file=sys.stderr)
            return 1
        finally:
            processes.stop_all()
    harness.banner(
        f"a line every {args.every_ms:g} ms for {args.seconds:g} s, followed (GET ?follow=1, {args.db})"
    )
    numbers = [number for number, _, _ in arrivals]
    in_order = numbers == list(range(count))
    print(f"  job status {final['status']}; lines written {count}, received {len(arrivals)}")
    print(f"  all received, in order: {'yes' if in_order else 'NO'}")
    latencies = sorted(arrived - written for _, written, arrived in arrivals)
    if not latencies:
        return 1
    p50 = harness.percentile(latencies, 50)
    print(harness.figure("  write-to-delivery p50", p50 * 1e3, "ms", TARGET_P50_S * 1e3, at_least=False))
    print(
        f"  write-to-delivery p99 {harness.percentile(latencies, 99) * 1e3:.0f} ms,"
        f" max {latencies[-1] * 1e3:.0f} ms"
    )
    return 0 if in_order and p50 < TARGET_P50_S and final["status"] == "done" else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--every-ms", type=float, default=100.0, help="the job writes a line this often")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    with harness.bounded(args.seconds * 2 + 180):
        return run(args)


if __name__ == "__main__":
    sys.exit(main())
