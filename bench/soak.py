"""Soak: mixed load for a long time with faults injected, then the history checker's verdict.

    .venv/bin/python bench/soak.py                       # an hour on SQLite
    .venv/bin/python bench/soak.py --duration-s 600 --backend postgres

Load, all through the SDK with idempotency keys and client retries through outages: short jobs,
jobs that fail and are retried (``max_retries`` 2), 2-task gangs, longer jobs, and cancels of
random live jobs; ``--workers`` real workers. Faults, one every ``--fault-every-s`` in turn:
``kill -9`` of the server (restarted on the same port and store 2 s later), ``kill -9`` of a worker
(restarted with the same id and state directory: it must stop what its killed run left), a
worker frozen with SIGSTOP past its lease then thawed, and (issue 24) three more:

- store lock: another process holds the store's write lock past the lease (SQLite: ``BEGIN
  IMMEDIATE`` on the file; PostgreSQL: ``LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE``), then lets go;
- full disk (SQLite only): the store lives on a small tmpfs the soak mounts, which a filler file
  fills past the lease, then frees (skipped, with a line saying so, on PostgreSQL or where the
  mount fails);
- partition: the first worker talks to the server through a proxy (``corral.testing.proxy``'s
  ``PartitionProxy``) that is cut past the lease, then healed; the worker self-fences before the
  server re-queues its jobs.

``--faults`` picks some of them. During each store stall ``/readyz`` must answer 503 and no job
may lose its lease in the stall or the lease after it (the server counts silence from the store's
recovery: core/hearing.py); a partition may cost only the cut-off worker's leases. At the end
submitting stops, every job must reach a terminal status, and ``corral.testing.history`` checks
the whole history (one running attempt at a time, no attempt reported twice, one end per job, no
worker over capacity, gangs all or nothing); each idempotency key must have made exactly one job.
Exit 0 on a clean verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

import harness
import machine
from corral.client import Client
from corral.domain.status import NON_TERMINAL
from corral.testing import history
from corral.testing.faults import fill_disk, sqlite_write_lock_held
from corral.testing.proxy import PartitionProxy

LEASE_S = 5.0
SERVER_FLAGS = [
    "--heartbeat-timeout-s", str(LEASE_S),
    "--reaper-tick-s", "0.5",
    "--admission-tick-s", "0.5",
    "--worker-offline-s", "10",
    "--dead-worker-after-s", "10",
]  # fmt: skip
WORKER_FLAGS = ["--heartbeat-s", "0.5", "--poll-s", "0.2", "--preempt-grace-s", "1", "--claim-wait-s", "1"]
#: how long a store stall (a lock, a full disk) and a partition last: past the lease
STALL_S = 8.0
#: the worker that talks to the server through the relay the partition fault cuts
PARTITIONED = "soak-w0"
#: its label, which only the partition's probe job asks for
RELAYED = {"link": "relayed"}
#: the probe: a job on the cut-off worker that outlasts the cut, so its self-fence has work to stop
PROBE_S = 20


@dataclass
class Window:
    """One store stall or partition: when it ran (wall clock, as job events are stamped), and what
    ``/readyz`` answered meanwhile."""

    kind: str
    started_at: float
    ended_at: float = 0.0
    readyz: dict[int, int] = field(default_factory=dict)  # status code -> answers
    #: the worker it cuts off (a partition); None: a store stall, which cuts off none
    worker_id: str | None = None
    #: lease_expired events from its start to a lease after its end: of its worker, of the others
    own_losses: int = 0
    other_losses: int = 0
    #: self-fences ("lease not renewed in time") in the same span: the cut-off worker's, or (a
    #: store stall) every worker's
    fences: int = 0
    #: a partition's probe job, running on the cut-off worker when the cut came (None: it did not
    #: start in time); how long before the server re-queued it the worker stopped it (negative:
    #: after; None: not both happened)
    probe_id: str | None = None
    probe_margin_s: float | None = None

    def span(self, at: float) -> bool:
        """Whether ``at`` falls in the window or the lease (and a reaper tick or two) after it."""
        return self.started_at <= at <= self.ended_at + LEASE_S + 2


def probe_line(window: Window) -> str:
    if window.probe_id is None:
        return "no probe (it did not start in time)"
    if window.probe_margin_s is None:
        return f"probe {window.probe_id} not both fenced and re-queued"
    when = "before" if window.probe_margin_s > 0 else "AFTER"
    return f"probe fenced {abs(window.probe_margin_s):.1f} s {when} the server re-queued it"


@contextlib.contextmanager
def small_disk(directory: Path, size_mib: int) -> Iterator[Path | None]:
    """A tmpfs of ``size_mib`` mounted in ``directory`` for the SQLite store, unmounted (lazily)
    after; None, with a line saying why, where it cannot be mounted (needs root)."""
    mount_point = directory / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        print(f"full disk fault skipped: cannot mount a tmpfs ({mounted.stderr.strip()})", flush=True)
        yield None
        return
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


class Soak:
    def __init__(
        self, args: argparse.Namespace, directory: Path, db_url: str, disk: Path | None = None
    ) -> None:
        self.args = args
        self.disk = disk
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
        self.relay: PartitionProxy | None = None
        self.rotation: list[tuple[str, Callable[[], None]]] = [
            ("server kill -9", self.kill_server),
            ("worker kill -9", self.kill_worker),
            ("worker SIGSTOP", self.freeze_worker),
            ("store lock", self.lock_store),
            ("full disk", self.fill_disk),
            ("partition", self.partition),
        ]
        if disk is None:
            self.rotation = [(name, fault) for name, fault in self.rotation if name != "full disk"]
        if args.faults:
            chosen = {name.strip() for name in args.faults.split(",")}
            self.rotation = [(name, fault) for name, fault in self.rotation if name in chosen]
        self.faults: dict[str, int] = {name: 0 for name, _ in self.rotation}
        self.windows: list[Window] = []
        self.probes: set[str] = set()
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
        log = self.directory / f"{worker_id}.log"
        if log.exists():  # a restart: keep the killed run's log (its self-fences are counted)
            log.rename(self.directory / f"{worker_id}.log.{len(self.processes.children)}")
        if worker_id == PARTITIONED:
            extra += ["--label", "=".join(*RELAYED.items())]
            if self.relay is None:
                self.relay = PartitionProxy(f"http://127.0.0.1:{self.port}")
        url = self.relay.url if worker_id == PARTITIONED and self.relay is not None else self.server.url
        self.workers[worker_id] = harness.start_worker(
            self.processes, url, worker_id, self.directory, cpus=self.args.cpus, extra_args=extra
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
                        answer = client.submit_body(spec, idempotency_key=key)
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
            page = client.list_jobs_page(limit=50, status="pending,running").items
            live = [job for job in page if job.id not in self.probes]  # a cancelled probe: no fence
            if live:
                client.cancel(rng.choice(live).id)
                self.cancels += 1
        except Exception:
            return  # an outage or a race with the job's end: nothing to count

    # --- faults ------------------------------------------------------------------------------

    def inject(self, round_number: int) -> None:
        name, fault = self.rotation[round_number % len(self.rotation)]
        fault()
        self.faults[name] += 1

    def kill_server(self) -> None:
        assert self.server is not None
        self.server.child.process.send_signal(signal.SIGKILL)
        self.server.child.process.wait(10)
        time.sleep(2)
        self.start_server()

    def kill_worker(self) -> None:
        worker_id = self.rng.choice(sorted(self.workers))
        process = self.workers[worker_id].process
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        time.sleep(1)
        self.start_worker(worker_id)

    def freeze_worker(self) -> None:
        worker_id = self.rng.choice(sorted(self.workers))
        process = self.workers[worker_id].process
        process.send_signal(signal.SIGSTOP)
        time.sleep(LEASE_S + 2)
        process.send_signal(signal.SIGCONT)

    def lock_store(self) -> None:
        """Another process (SQLite) or session (PostgreSQL) holds the write lock for ``STALL_S``."""
        with self.window("store lock"):
            if self.args.backend == "sqlite":
                with sqlite_write_lock_held(Path(self.db_url.removeprefix("sqlite:///"))):
                    time.sleep(STALL_S)
            else:
                import psycopg

                with psycopg.connect(self.db_url) as connection:  # a transaction until the block ends
                    connection.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
                    time.sleep(STALL_S)
                    connection.rollback()

    def fill_disk(self) -> None:
        """The store's disk full for ``STALL_S``: the write-ahead log truncated first, so that the
        very next write needs a new block."""
        assert self.disk is not None
        db_path = Path(self.db_url.removeprefix("sqlite:///"))
        with self.window("full disk"):
            with contextlib.closing(sqlite3.connect(db_path, timeout=30)) as connection:
                for _ in range(20):  # busy while a reader is in the log: try again
                    busy = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                    if not busy:
                        break
                    time.sleep(0.05)
            filler = fill_disk(self.disk)
            try:
                time.sleep(STALL_S)
            finally:
                filler.unlink()

    def partition(self) -> None:
        """The relayed worker cut off from the server for ``STALL_S``, then healed; first a probe
        job that only it can run is started there, so that the cut has a job for the self-fence
        to stop (the load's jobs are mostly over before a fence is due)."""
        assert self.relay is not None
        probe_id = self.start_probe()
        with self.window("partition", PARTITIONED) as window:
            window.probe_id = probe_id
            self.relay.cut()
            try:
                time.sleep(STALL_S)
            finally:
                self.relay.heal()

    def start_probe(self) -> str | None:
        """A ``PROBE_S`` job for the relayed worker alone; its id once it runs there (None if it
        does not within 15 s: the cut goes ahead, without a probe)."""
        key = f"soak-probe-{self.faults['partition']}"
        spec = {"command": f"sleep {PROBE_S}", "resources": {"cpus": 1}, "constraints": {"labels": RELAYED}}
        deadline = time.monotonic() + 15
        with Client(f"http://127.0.0.1:{self.port}", timeout_s=10) as client, contextlib.suppress(Exception):
            job_id = getattr(client.submit_body(spec, idempotency_key=key), "id", None)
            self.probes.add(str(job_id))
            with self.keys_lock:
                self.keys.setdefault(key, set()).add(str(job_id))
            while job_id is not None and time.monotonic() < deadline:
                if client.get_job(job_id).status == "running":
                    time.sleep(1)  # the worker has it started, not only claimed
                    return str(job_id)
                time.sleep(0.2)
        return None

    @contextlib.contextmanager
    def window(self, kind: str, worker_id: str | None = None) -> Iterator[Window]:
        """Records the fault's window, and polls ``/readyz`` through it."""
        window = Window(kind, time.time(), worker_id=worker_id)
        done = threading.Event()

        def poll() -> None:
            with httpx.Client(timeout=2) as client:
                while not done.is_set():
                    try:
                        code = client.get(f"http://127.0.0.1:{self.port}/readyz").status_code
                    except httpx.HTTPError:
                        code = 0
                    window.readyz[code] = window.readyz.get(code, 0) + 1
                    done.wait(0.25)

        poller = threading.Thread(target=poll, name="readyz", daemon=True)
        poller.start()
        try:
            yield window
        finally:
            window.ended_at = time.time()
            done.set()
            poller.join(5)
            self.windows.append(window)

    def count_lease_losses(self) -> None:
        """Per window, the lease_expired events in its span, split by worker (in a store stall,
        each is a healthy job re-queued), and the cut-off worker's self-fences."""
        from corral.store import open_store

        store = open_store(self.db_url)
        try:
            _, events, _ = history.load(store)
        finally:
            store.close()
        lapses: list[tuple[float, str | None]] = []
        for job_events in events.values():
            holder = None  # the worker of the attempt: a re-queue's own event names none
            for event in job_events:
                holder = event.worker_id or holder
                if event.reason is not None and event.reason.code == "lease_expired":
                    lapses.append((event.at, holder))
        fenced = self.self_fences()
        fences = {worker_id: [at for at, _ in stops] for worker_id, stops in fenced.items()}
        for window in self.windows:
            for at, worker_id in lapses:
                if window.span(at):
                    if window.worker_id is not None and worker_id == window.worker_id:
                        window.own_losses += 1
                    else:
                        window.other_losses += 1
            of = [window.worker_id] if window.worker_id is not None else list(fences)
            window.fences = sum(window.span(at) for worker_id in of for at in fences.get(worker_id, []))
            if window.probe_id is not None:
                stopped = [at for at, job_id in fenced.get(PARTITIONED, []) if job_id == window.probe_id]
                requeued = [
                    event.at
                    for event in events.get(window.probe_id, [])
                    if event.reason is not None and event.reason.code == "lease_expired"
                ]
                if stopped and requeued:
                    window.probe_margin_s = min(requeued) - min(stopped)

    def self_fences(self) -> dict[str, list[tuple[float, str]]]:
        """When each worker stopped a job (and which) for want of a renewed lease, from its logs."""
        fences: dict[str, list[tuple[float, str]]] = {}
        for worker_id in self.workers:
            for log in self.directory.glob(f"{worker_id}.log*"):
                for line in log.read_text(errors="replace").splitlines():
                    if "lease not renewed in time" not in line:  # the fence's own line
                        continue
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        fields = json.loads(line)
                        at = datetime.fromisoformat(fields["time"]).timestamp()
                        fences.setdefault(worker_id, []).append((at, fields["job_id"]))
        return fences

    def faults_clean(self) -> bool:
        """Every store stall answered 503 on ``/readyz`` at least once and cost no job its lease;
        a partition cost no other worker's job its lease, and its worker stopped the probe before
        the server re-queued it."""
        return all(
            window.other_losses == 0
            and (window.worker_id is not None or window.readyz.get(503, 0) > 0)
            and (window.probe_margin_s is None or window.probe_margin_s > 0)
            for window in self.windows
        )

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
        if self.relay is not None:
            self.relay.close()
        verdict = history.check_url(self.db_url)
        if self.args.keep and self.disk is not None:  # the tmpfs goes at the end: keep a copy
            with contextlib.suppress(OSError):
                shutil.copy(Path(self.db_url.removeprefix("sqlite:///")), self.directory / "bench.db")
        self.count_lease_losses()
        twice = [key for key, made in self.keys.items() if len(made) != 1]
        passed = verdict.ok and ended and not twice and self.faults_clean()
        self.report(load_s, ended, verdict, twice, passed)
        return 0 if passed else 1

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

    def report(
        self, load_s: float, ended: bool, verdict: history.Verdict, twice: list[str], passed: bool
    ) -> None:
        harness.banner("soak")
        machine.print_machine()
        print(
            f"store: {self.args.backend}; load for {load_s:.0f} s with {self.args.workers} workers "
            f"({self.args.cpus} CPUs each), {self.args.submitters} submitters"
        )
        print(f"faults: {', '.join(f'{name} x{count}' for name, count in self.faults.items())}")
        if self.disk is None:
            why = (
                "the store is PostgreSQL" if self.args.backend == "postgres" else "no tmpfs could be mounted"
            )
            print(f"full disk: skipped ({why})")
        print(f"load average at the end: {harness.load_average()}")
        for window in self.windows:
            answers = ", ".join(
                f"{code or 'no answer'} x{count}" for code, count in sorted(window.readyz.items())
            )
            print(
                f"  {window.kind} at {time.strftime('%H:%M:%S', time.gmtime(window.started_at))} for "
                f"{window.ended_at - window.started_at:.1f} s: /readyz {answers}; "
                + (
                    f"leases lost in it or the lease after: {window.other_losses}; "
                    f"self-fences {window.fences}"
                    if window.worker_id is None
                    else f"{window.worker_id}'s leases lost {window.own_losses}, self-fences "
                    f"{window.fences}; other workers' leases lost {window.other_losses}; "
                    + probe_line(window)
                )
            )
        print(
            f"idempotency keys: {len(self.keys)} ({len(twice)} made other than one job); "
            f"submit errors retried: {self.submit_errors}; cancels: {self.cancels}"
        )
        print(f"every job ended: {'yes' if ended else 'NO'} ({self.drain_s:.0f} s after the load stopped)")
        print(verdict.summary())
        if not self.faults_clean():
            print(
                "FAULT: a store stall without a 503 on /readyz, a lease lost to a worker not cut off, "
                "or a probe fenced after its re-queue"
            )
        print(f"verdict: {'PASS' if passed else 'FAIL'}", flush=True)


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
    parser.add_argument(
        "--faults",
        default="",
        help="only these faults, comma-separated (e.g. 'partition,store lock') [all of them]",
    )
    parser.add_argument("--drain-timeout-s", type=float, default=600)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument(
        "--disk-mib", type=int, default=256, help="the SQLite store's tmpfs (the full disk fault) [256]"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs; not the tmpfs)")
    args = parser.parse_args()
    if args.backend == "postgres":
        print("full disk fault skipped: the store is PostgreSQL (no file system the soak controls)")
    with (
        harness.bounded(args.duration_s + args.drain_timeout_s + 300),
        harness.workdir(args.keep) as directory,
        small_disk(directory, args.disk_mib)
        if args.backend == "sqlite"
        else contextlib.nullcontext() as disk,
        harness.store_url(args.backend, disk or directory) as db_url,
    ):
        soak = Soak(args, directory, db_url, disk)
        try:
            return soak.run()
        finally:
            soak.processes.stop_all()


if __name__ == "__main__":
    sys.exit(main())
