"""A job writing 50 MB/s of output must not block on its pipe: measured with a real server and worker.

The job is a small Python writer that paces ``os.write`` calls of 64 KiB to ``--rate`` MB/s for
``--seconds`` and records, for each write, how long it took (a write blocks when the pipe is full:
the worker is not draining it fast enough). Two runs of the same writer:

1. **baseline**: the writer under a bare reader (``subprocess`` with a thread draining the pipe into
   nothing), the cost of the pipe itself;
2. **corral**: the writer as a job of a real ``corral worker`` against a real ``corral server``: its
   output read by the worker, handed to the log shipper and sent to the server in chunks.

Printed per run: the rate the job achieved, its write latency p50 / p99 / max, the share of its
time spent in writes, and for the corral run what reached the store (bytes stored, dropped by the
server's cap, dropped by the worker's buffer) and the worker's CPU.

    .venv/bin/python bench/log_throughput.py [--rate 50] [--seconds 10] [--db sqlite|postgres]

Target: the job achieves at least 98% of ``--rate``, no write of it takes 10 ms or more (a job
blocked on a full pipe would wait until the worker catches up), and the last bytes it wrote are in
the store when it is done.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import harness
import machine
from corral.client import Client

MAX_WRITE_MS = 10.0

WRITER = r"""
import json, os, sys, time
rate, seconds, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
block = (b"x" * 127 + b"\n") * 512  # 64 KiB of lines
per_s = rate * 1e6 / len(block)
latencies = []
start = time.perf_counter()
n = 0
while True:
    now = time.perf_counter()
    if now - start >= seconds:
        break
    due = start + n / per_s
    if due > now:
        time.sleep(due - now)
    before = time.perf_counter()
    os.write(1, block)
    latencies.append(time.perf_counter() - before)
    n += 1
elapsed = time.perf_counter() - start
os.write(1, b"THE-LAST-LINE\n")
json.dump({"bytes": n * len(block), "elapsed": elapsed, "latencies": latencies}, open(out, "w"))
"""


def summarize(label: str, stats: dict, rate: float) -> bool:
    latencies = sorted(stats["latencies"])
    achieved = stats["bytes"] / stats["elapsed"] / 1e6
    blocked = sum(latencies)
    blocked_share = blocked / stats["elapsed"]
    print(f"  {label}:")
    print(harness.figure("    achieved rate", achieved, "MB/s", rate * 0.98))
    print(f"    writes {len(latencies)}, {stats['bytes'] / 1e6:.0f} MB in {stats['elapsed']:.2f} s")
    print(
        f"    write latency p50 {harness.percentile(latencies, 50) * 1e6:.0f} us,"
        f" p99 {harness.percentile(latencies, 99) * 1e6:.0f} us, max {latencies[-1] * 1e3:.1f} ms"
    )
    print(harness.figure("    longest write", latencies[-1] * 1e3, "ms", MAX_WRITE_MS, at_least=False))
    print(
        f"    time in writes {blocked_share * 100:.1f}% (the syscalls, and waiting for a CPU on a busy box)"
    )
    return achieved >= rate * 0.98 and latencies[-1] * 1e3 < MAX_WRITE_MS


def baseline(directory: Path, rate: float, seconds: float) -> dict:
    script = directory / "writer.py"
    stats = directory / "baseline.json"
    process = subprocess.Popen(
        [sys.executable, str(script), str(rate), str(seconds), str(stats)], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    stream = process.stdout

    def drain() -> None:
        while stream.read1(65536):  # type: ignore[attr-defined]
            pass

    reader = threading.Thread(target=drain)
    reader.start()
    process.wait()
    reader.join()
    return json.loads(stats.read_text())


def run(args: argparse.Namespace) -> int:
    machine.print_machine()
    processes = harness.Processes()
    with harness.workdir(args.keep) as directory, harness.store_url(args.db, directory) as db_url:
        (directory / "writer.py").write_text(WRITER)
        base = baseline(directory, args.rate, args.seconds)
        try:
            server = harness.start_server(processes, db_url, directory)
            worker = harness.start_worker(processes, server.url, "logs-1", directory, cpus=4, heartbeat_s=5.0)
            stats_path = directory / "corral.json"
            with Client(server.url) as client:
                deadline = time.monotonic() + 30
                while not client.workers():
                    if time.monotonic() > deadline:
                        raise RuntimeError("the worker did not register")
                    time.sleep(0.1)
                cpu_before = harness.cpu_seconds(worker.process.pid, children=False)
                command = (
                    f"{sys.executable} {directory / 'writer.py'} {args.rate} {args.seconds} {stats_path}"
                )
                job = client.submit_body({"command": command, "resources": {"cpus": 1}})
                deadline = time.monotonic() + args.seconds + 120
                while client.get_job(job["id"])["status"] not in ("done", "failed", "cancelled"):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the job did not end")
                    time.sleep(0.2)
                worker_cpu = harness.cpu_seconds(worker.process.pid, children=False) - cpu_before
                final = client.get_job(job["id"])
                stored = client.logs(job["id"])
                metrics = client.request("GET", "/metrics").text
        except harness.BenchTimeout as error:
            print(f"stopped: {error}", file=sys.stderr)
            return 1
        finally:
            processes.stop_all()
        ran = json.loads(stats_path.read_text())
    harness.banner(f"job output at {args.rate:g} MB/s for {args.seconds:g} s ({args.db})")
    summarize("baseline (a bare pipe reader)", base, args.rate)
    ok = summarize("corral (real worker shipping to a real server)", ran, args.rate)
    worker_notes = stored.text.count("bytes of output dropped")
    print(f"    job status {final['status']}; stored {stored.size / 1e6:.1f} MB of the attempt's stream")
    print(
        f"    dropped by the server's cap: {stored.dropped / 1e6:.1f} MB (CORRAL_LOG_MAX_BYTES);"
        f" worker drop notes in the kept bytes: {worker_notes}"
    )
    print(f"    corral_log_bytes_stored_total {harness.metric(metrics, 'corral_log_bytes_stored_total'):.0f}")
    share = worker_cpu / ran["elapsed"] * 100
    print(f"    worker CPU during the run: {worker_cpu:.2f} s ({share:.0f}% of a core)")
    last = stored.text.endswith("THE-LAST-LINE\n")
    print(f"    the job's last line is in the store: {'yes' if last else 'NO'}")
    return 0 if ok and last and final["status"] == "done" else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=50.0, help="MB/s the job writes")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    with harness.bounded(args.seconds * 3 + 180):
        return run(args)


if __name__ == "__main__":
    sys.exit(main())
