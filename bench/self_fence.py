"""The self-fence against server outages, at default settings: which outages stop running work.

A real server (lease ``CORRAL_HEARTBEAT_TIMEOUT_S`` 30 s) and a real worker (heartbeat every 5 s,
``--self-fence`` with its default 2 s margin) run one job; the server is killed with SIGKILL and
started again on the same store and port after ``D`` seconds, for each ``D`` of ``--outages``.
Per outage: how long the server was really unreachable (kill to accepting again), whether the
worker fenced the job (its log), and how the job went on (the attempt that ended it; a fenced job
is handed back without spending an attempt and runs again).

    .venv/bin/python bench/self_fence.py [--outages 0,10,20,30] [--db sqlite|postgres]

What to read: outages shorter than the lease less the margin less a heartbeat interval
(30 - 2 - 5 = 23 s) never stop anything; past 28 s every job is stopped and handed back.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import harness
import machine
from corral.client import Client

FENCE_LINE = "lease not renewed in time; stopping the job (self-fence)"


def wait(check, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def trial(args: argparse.Namespace, outage_s: float, directory: Path, db_url: str) -> str:
    processes = harness.Processes()
    marks = directory / f"marks-{outage_s:g}"
    marks.mkdir()
    try:
        server = harness.start_server(processes, db_url, directory)
        worker = harness.start_worker(
            processes,
            server.url,
            f"fence-{outage_s:g}",
            directory,
            cpus=1,
            heartbeat_s=5.0,
            extra_args=["--self-fence-margin-s", str(args.margin_s), "--state-dir", str(marks / "state")],
        )
        go = marks / "go"
        command = f"echo $CORRAL_ATTEMPT >> {marks}/attempts; while [ ! -e {go} ]; do sleep 0.1; done"
        with Client(server.url) as client:
            job = client.submit_body({"command": command, "resources": {"cpus": 1}})
            wait(lambda: (marks / "attempts").exists(), 30, "the job to start")
        time.sleep(2.5)  # mid-way between two heartbeats, on average
        killed_at = time.monotonic()
        server.child.process.send_signal(signal.SIGKILL)
        server.child.process.wait(timeout=10)
        time.sleep(outage_s)
        harness.start_server(processes, db_url, directory, ["--port", str(server.port)])
        down_s = time.monotonic() - killed_at
        with Client(server.url) as client:
            # A lease and a half after the restart: a job not fenced by then is not going to be.
            time.sleep(45)
            fenced = FENCE_LINE in worker.log.read_text(errors="replace")
            go.touch()
            ended = wait(
                lambda: client.get_job(job.id).status in ("done", "failed") and client.get_job(job.id),
                60,
                "the job to end",
            )
            attempts = (marks / "attempts").read_text().split()
        verdict = "FENCED (handed back, ran again)" if fenced else "kept running"
        return (
            f"  outage {outage_s:>4g} s (down {down_s:5.1f} s): {verdict:32s} "
            f"job {ended.status} in attempt {ended.attempt}, runs {attempts}"
        )
    finally:
        processes.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--outages", default="0,10,20,30")
    parser.add_argument("--margin-s", type=float, default=2.0)
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    outages = [float(value) for value in args.outages.split(",")]
    machine.print_machine()
    lines = []
    with (
        harness.bounded(sum(outages) + 150 * len(outages)),
        harness.workdir(args.keep) as directory,
    ):
        for outage_s in outages:
            place = directory / f"outage-{outage_s:g}"
            place.mkdir()
            with harness.store_url(args.db, place) as db_url:
                lines.append(trial(args, outage_s, place, db_url))
                print(lines[-1], flush=True)
    harness.banner(f"self-fence against server outages: lease 30 s, heartbeat 5 s, margin {args.margin_s} s")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
