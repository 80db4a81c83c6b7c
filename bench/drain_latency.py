"""Gang drain latency with real workers at default settings: from a rank's failure to the gang being
back in ``blocked``.

A gang of ``--size`` ranks runs on as many real ``corral worker`` processes (default settings: job
heartbeat every 5 s, SIGTERM grace 15 s, reaper every 10 s). Rank 0 sleeps a random part of a
heartbeat interval, then exits 1; the other ranks sleep until they are stopped and exit at once on
SIGTERM. The figure is, per round, the time from rank 0's exit (written by the rank itself just
before it exits) to the moment the gang is ``blocked`` again (the server's ``at`` of the task's
``-> blocked`` event). Each round re-runs the gang (the admission cycle re-reserves it), up to
``--rounds`` rounds (the gang's ``max_retries`` is set high enough).

    .venv/bin/python bench/drain_latency.py [--rounds 5] [--size 2] [--db sqlite|postgres]

Target: under one heartbeat interval plus 2 s (7 s at the 5 s default). workron needs 45-55 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

import harness
import machine
from corral.client import Client

HEARTBEAT_S = 5.0
TARGET_S = HEARTBEAT_S + 2.0

RANK_SCRIPT = r"""
if [ "$RANK" = "0" ]; then
  sleep "$(python3 -c 'import random; print(round(1 + random.random() * 4, 2))')"
  python3 -c 'import time; print(time.time())' > "{marks}/fail-$CORRAL_ATTEMPT-$CORRAL_JOB_ID"
  exit 1
fi
trap 'exit 143' TERM
while true; do sleep 0.1; done
"""


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def blocked_at(client: Client, job_id: str, after: float) -> float | None:
    """When the task went back to ``blocked`` after ``after`` (its drain's completion)."""
    for event in client.events(job_id):
        at = parse_time(event["at"])
        if event["to"] == "blocked" and event["from"] in ("preempted", "preempting") and at >= after - 0.01:
            return at
    return None


def run(args: argparse.Namespace) -> int:
    machine.print_machine()
    latencies: list[float] = []
    processes = harness.Processes()
    with harness.workdir(args.keep) as directory, harness.store_url(args.db, directory) as db_url:
        marks = directory / "marks"
        marks.mkdir()
        try:
            server = harness.start_server(processes, db_url, directory)
            for index in range(args.size):
                harness.start_worker(
                    processes, server.url, f"drain-{index}", directory, cpus=4, heartbeat_s=HEARTBEAT_S
                )
            with Client(server.url) as client:
                deadline = time.monotonic() + 30
                while len(client.workers()) < args.size:
                    if time.monotonic() > deadline:
                        raise RuntimeError("workers did not register")
                    time.sleep(0.1)
                gang = client.submit_body(
                    {
                        "command": RANK_SCRIPT.format(marks=marks),
                        "gang_size": args.size,
                        "resources": {"cpus": 1},
                        "max_retries": args.rounds + 5,
                    }
                )
                rank0 = gang["tasks"][0]
                for round_number in range(1, args.rounds + 1):
                    mark = _wait_for_mark(marks, round_number, rank0, args.round_timeout_s)
                    failed_at = float(mark.read_text())
                    end = time.monotonic() + args.round_timeout_s
                    blocked = None
                    while blocked is None and time.monotonic() < end:
                        blocked = blocked_at(client, rank0, failed_at)
                        time.sleep(0.05)
                    if blocked is None:
                        raise RuntimeError(f"round {round_number}: the gang never came back to blocked")
                    latencies.append(blocked - failed_at)
                    print(f"  round {round_number}: failure -> blocked {blocked - failed_at:.2f} s")
        except harness.BenchTimeout as error:
            print(f"stopped: {error}", file=sys.stderr)
            return 1
        finally:
            processes.stop_all()
    harness.banner(f"drain latency, gang of {args.size} on real workers, default settings ({args.db})")
    print(
        harness.figure(
            "p50 failure -> gang blocked", harness.percentile(latencies, 50), "s", TARGET_S, at_least=False
        )
    )
    print(harness.figure("max failure -> gang blocked", max(latencies), "s", TARGET_S, at_least=False))
    print(f"  rounds {len(latencies)}; workron: 45-55 s (force-drain after 45 s, reaper every 10 s)")
    return 0


def _wait_for_mark(marks: Path, attempt: int, job_id: str, timeout_s: float) -> Path:
    path = marks / f"fail-{attempt}-{job_id}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path
        time.sleep(0.05)
    raise RuntimeError(f"rank 0 did not run attempt {attempt} within {timeout_s:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=2)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--round-timeout-s", type=float, default=60.0)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    with harness.bounded(args.rounds * args.round_timeout_s + 60):
        return run(args)


if __name__ == "__main__":
    sys.exit(main())
