"""Soak: mixed load for a long time with faults injected, then the history checker's verdict.

    .venv/bin/python bench/soak.py                       # an hour on SQLite
    .venv/bin/python bench/soak.py --duration-s 600 --backend postgres

Load, all through the SDK with idempotency keys and client retries through outages: short jobs,
jobs that fail and are retried (``max_retries`` 2), 2-task gangs, longer jobs, and cancels of
random live jobs; ``--workers`` real workers. Faults, one every ``--fault-every-s`` in turn:
``kill -9`` of the server (restarted on the same port and store 2 s later), ``kill -9`` of a worker
(restarted with the same id and state directory: it must stop what its killed run left), and a
worker frozen with SIGSTOP past its lease then thawed. At the end submitting stops, every job must
reach a terminal status, and ``corral.testing.history`` checks the whole history (one running
attempt at a time, no attempt reported twice, one end per job, no worker over capacity, gangs all
or nothing); each idempotency key must have made exactly one job. Exit 0 on a clean verdict.
"""

from __future__ import annotations

import argparse
import itertools
import random
import signal
import sys
import threading
import time
from pathlib import Path

import harness
import machine
from corral.client import Client
from corral.domain.status import NON_TERMINAL
from corral.testing import history

LEASE_S = 5.0
SERVER_FLAGS = [
    "--heartbeat-timeout-s", str(LEASE_S),
    "--reaper-tick-s", "0.5",
    "--admission-tick-s", "0.5",
    "--worker-offline-s", "10",
    "--dead-worker-after-s", "10",
]  # fmt: skip
WORKER_FLAGS = ["--heartbeat-s", "0.5", "--poll-s", "0.2", "--preempt-grace-s", "1", "--claim-wait-s", "1"]


class Soak:
    def __init__(self, args: argparse.Namespace, directory: Path, db_url: str) -> None:
        self.args = args
        self.directory = directory
        self.db_url = db_url
        self.processes = harness.Processes()
        self.rng = random.Random(args.seed)
        self.server: harness.Server | None = None
        self.port = 0
        self.workers: dict[str, harness.Child] = {}
        self.keys: dict[str, set[str]] = {}
        self.keys_lock = threading.Lock()
        self.stop_load = threading.Event()
        self.faults: dict[str, int] = {"server kill -9": 0, "worker kill -9": 0, "worker SIGSTOP": 0}
        self.submit_errors = 0
        self.cancels = 0
        self.drain_s = 0.0

    # --- processes ---------------------------------------------------------------------------

    def start_server(self) -> None:
        extra = [*SERVER_FLAGS, "--port", str(self.port)] if self.port else SERVER_FLAGS
        self.server = harness.start_server(self.processes, self.db_url, self.directory, extra)
        self.port = self.server.port

    def start_worker(self, worker_id: str) -> None:
        assert self.server is not None
        extra = [*WORKER_FLAGS, "--state-dir", str(self.directory / f"state-{worker_id}")]
        self.workers[worker_id] = harness.start_worker(
            self.processes, self.server.url, worker_id, self.directory, cpus=self.args.cpus, extra_args=extra
        )

    # --- load --------------------------------------------------------------------------------

    def job(self, rng: random.Random) -> dict[str, object]:
        draw = rng.random()
        if draw < 0.6:
            return {"command": "sleep 0.3", "resources": {"cpus": 1}}
        if draw < 0.75:
            return {"command": "sleep 0.2; exit 1", "resources": {"cpus": 1}, "max_retries": 2}
        if draw < 0.9:
            return {"command": "sleep 1", "gang_size": 2, "resources": {"cpus": 1}}
        return {"command": "sleep 3", "resources": {"cpus": 2}}

    def submitter(self, index: int) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        assert self.server is not None
        with Client(f"http://127.0.0.1:{self.port}", timeout_s=10) as client:
            for number in itertools.count():
                if self.stop_load.is_set():
                    return
                key = f"soak-{index}-{number}"
                spec = self.job(rng)
                deadline = time.monotonic() + 60
                while not self.stop_load.is_set():
                    try:
                        answer = client.submit(spec, idempotency_key=key)
                        made = answer.id if hasattr(answer, "id") else answer.gang_id
                        with self.keys_lock:
                            self.keys.setdefault(key, set()).add(made)
                        break
                    except Exception:
                        self.submit_errors += 1
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.3)
                if rng.random() < 0.1:
                    self.cancel_one(client, rng)
                time.sleep(self.args.submit_pause_s)

    def cancel_one(self, client: Client, rng: random.Random) -> None:
        try:
            live = client.list_jobs_page(limit=50, status="pending,running").items
            if live:
                client.cancel(rng.choice(live).id)
                self.cancels += 1
        except Exception:
            return  # an outage or a race with the job's end: nothing to count

    # --- faults ------------------------------------------------------------------------------

    def inject(self, round_number: int) -> None:
        kind = round_number % 3
        if kind == 0:
            assert self.server is not None
            self.server.child.process.send_signal(signal.SIGKILL)
            self.server.child.process.wait(10)
            self.faults["server kill -9"] += 1
            time.sleep(2)
            self.start_server()
        elif kind == 1:
            worker_id = self.rng.choice(sorted(self.workers))
            process = self.workers[worker_id].process
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            self.faults["worker kill -9"] += 1
            time.sleep(1)
            self.start_worker(worker_id)
        else:
            worker_id = self.rng.choice(sorted(self.workers))
            process = self.workers[worker_id].process
            process.send_signal(signal.SIGSTOP)
            self.faults["worker SIGSTOP"] += 1
            time.sleep(LEASE_S + 2)
            process.send_signal(signal.SIGCONT)

    # --- the run -----------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        started = time.monotonic()
        self.start_server()
        for index in range(args.workers):
            self.start_worker(f"soak-w{index}")
        threads = [
            threading.Thread(target=self.submitter, args=(index,), daemon=True)
            for index in range(args.submitters)
        ]
        for thread in threads:
            thread.start()
        next_fault = started + args.fault_every_s
        rounds = 0
        while time.monotonic() - started < args.duration_s:
            time.sleep(0.5)
            if time.monotonic() >= next_fault:
                self.inject(rounds)
                rounds += 1
                next_fault = time.monotonic() + args.fault_every_s
        self.stop_load.set()
        for thread in threads:
            thread.join(90)
        load_s = time.monotonic() - started
        assert self.server is not None
        drain_started = time.monotonic()
        ended = self.wait_terminal(args.drain_timeout_s)
        self.drain_s = time.monotonic() - drain_started
        # Checked on a quiet store: rows and events are read one after the other.
        self.processes.stop_all()
        verdict = history.check_url(self.db_url)
        twice = [key for key, made in self.keys.items() if len(made) != 1]
        self.report(load_s, ended, verdict, twice)
        return 0 if verdict.ok and ended and not twice else 1

    def wait_terminal(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with Client(f"http://127.0.0.1:{self.port}", timeout_s=30) as client:
            while time.monotonic() < deadline:
                try:
                    statuses = ",".join(sorted(status.value for status in NON_TERMINAL))
                    live = client.list_jobs_page(limit=1, status=statuses).items
                    if not live:
                        return True
                except Exception as error:
                    print(f"(waiting for the server: {error})", flush=True)
                time.sleep(1)
        return False

    def report(self, load_s: float, ended: bool, verdict: history.Verdict, twice: list[str]) -> None:
        harness.banner("soak")
        machine.print_machine()
        print(
            f"store: {self.args.backend}; load for {load_s:.0f} s with {self.args.workers} workers "
            f"({self.args.cpus} CPUs each), {self.args.submitters} submitters"
        )
        print(f"faults: {', '.join(f'{name} x{count}' for name, count in self.faults.items())}")
        print(
            f"idempotency keys: {len(self.keys)} ({len(twice)} made other than one job); "
            f"submit errors retried: {self.submit_errors}; cancels: {self.cancels}"
        )
        print(f"every job ended: {'yes' if ended else 'NO'} ({self.drain_s:.0f} s after the load stopped)")
        print(verdict.summary())
        print(f"verdict: {'PASS' if verdict.ok and ended and not twice else 'FAIL'}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration-s", type=float, default=3600, help="how long the load runs [3600]")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=4, help="CPUs each worker offers")
    parser.add_argument("--submitters", type=int, default=2)
    parser.add_argument(
        "--submit-pause-s", type=float, default=0.25, help="each submitter's pause (the cluster keeps up)"
    )
    parser.add_argument("--fault-every-s", type=float, default=20)
    parser.add_argument("--drain-timeout-s", type=float, default=600)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, store)")
    args = parser.parse_args()
    with (
        harness.bounded(args.duration_s + args.drain_timeout_s + 300),
        harness.workdir(args.keep) as directory,
        harness.store_url(args.backend, directory) as db_url,
    ):
        soak = Soak(args, directory, db_url)
        try:
            return soak.run()
        finally:
            soak.processes.stop_all()


if __name__ == "__main__":
    sys.exit(main())
