"""The agent: register, heartbeat the worker and its jobs, claim jobs and run each in its own
thread, shut down.

Threads and why:
- the claim loop long-polls ``GET /jobs/next`` and starts every claimed job at once, then claims
  again: the server decides what fits, so the worker runs as many jobs as the server hands it. It
  asks for as many jobs as its free capacity could hold (``max=N``, at most ``CLAIM_BATCH``), and
  for one at a time from a server that does not know ``max`` (a 400, or one plain claim for an
  answer);
- the heartbeat thread says "alive, running these" every ``worker_heartbeat_s``, and while jobs
  run, every ``heartbeat_s`` with every running attempt's lease and progress in the same request
  (``jobs``), dispatching each job's answer (checkpoint, preempt, stale) to its attempt. A server
  that does not know the batched body (a 400 naming ``jobs``, or an answer without per-job
  answers) gets one job heartbeat per attempt from this same thread instead, decided once;
- one thread per job attempt (``JobRun``): its process, its watchdogs and its report; the threads
  are reused from one attempt to the next (``corral.worker.threads``), so a short job starts none.

A job a watchdog tripped is dropped from the worker heartbeat's ``running`` list at once (and a
heartbeat is sent right away): the worker must not advertise a busy ghost while the job is being
stopped. GPUs whose job would not die after SIGKILL are reported in every heartbeat as
``unhealthy_gpus``, so the server stops placing work on them; they stay unhealthy until the worker
restarts (only a host reboot or a driver reset really frees them).

The server being unreachable is a normal condition (restarts, upgrades): every loop logs a
warning, waits ``poll_s`` and tries again. Nothing here lets an exception end the worker. Only a
job whose lease went unrenewed for nearly the whole lease is stopped, by its own attempt (the
self-fence, ``corral.worker.fence``): past that, the server may be giving it to another worker.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from typing import Any

from corral.client_errors import ApiError, ClientError, ServerUnreachable
from corral.config import WorkerSettings
from corral.protocol.answers import ClaimAnswer, WorkerHeartbeatAnswer
from corral.worker import cgroups, identity, leftovers, log_shipper
from corral.worker.calls import MAX_CLAIM, WorkerClient
from corral.worker.cgroup_limits import gpu_device_numbers
from corral.worker.fence import heard_through_a_stall
from corral.worker.final_reports import FinalReports
from corral.worker.job_run import SHUTDOWN_ERROR, BeatRequest, JobRun, StopReason
from corral.worker.reporting import deliver
from corral.worker.resources import Offer
from corral.worker.samplers import Samplers, open_gpu_sampler
from corral.worker.samplers.process import ProcessTreeSampler
from corral.worker.threads import ThreadPool

logger = logging.getLogger("corral.worker.agent")

# How long shutdown waits for a claim in flight before it stops accepting claimed jobs.
CLAIM_JOIN_S = 10.0
# Reports and heartbeats should not hang for a long-poll's time when the server is slow.
API_TIMEOUT_S = 15.0
# After the stop signal, how long a job's report may take on top of the stop itself.
REPORT_ALLOWANCE_S = 30.0
#: the most jobs one claim asks for. A worker with room for 64 that took 64 short jobs at once
#: started 64 processes (and woke 64 threads) together, and left the other workers of a shared
#: queue idle meanwhile: with 4 workers on 2 cores, 16 a claim spread the jobs evenly and cost
#: each job 30% less of its worker's CPU than 64 did (``bench/e2e.py``). A worker with more room
#: claims again at once; the server bounds ``max`` at ``MAX_CLAIM``.
CLAIM_BATCH = 16
#: 4xx answers that may change if the worker asks again: a timeout, a conflict that ends with the
#: jobs it names (a re-register below what the worker still holds), too many requests
TRANSIENT_REFUSALS = frozenset({408, 409, 429})


def refused_for_good(error: ApiError) -> bool:
    """Whether a refused registration would be refused again however often the worker asks: a
    4xx other than ``TRANSIENT_REFUSALS`` (bad resources, a token the server does not take). A 5xx,
    a busy store and an unreachable server are worth asking again."""
    return 400 <= error.status < 500 and error.status not in TRANSIENT_REFUSALS


class Agent:
    def __init__(self, settings: WorkerSettings, worker_id: str, address: str, offer: Offer) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.address = address
        self.offer = offer
        self.fields = {"worker_id": worker_id}
        self._claims = WorkerClient(settings.server, ca_file=settings.ca_file)
        self._api = WorkerClient(settings.server, timeout_s=API_TIMEOUT_S, ca_file=settings.ca_file)
        # the done and fail reports of jobs ending together, in one request
        self._final_reports = FinalReports(self.worker_id, settings.report_window_s)
        #: whether the server takes ``max`` on a claim / ``jobs`` in the worker heartbeat; None
        #: until its first answer says
        self.multi_claim: bool | None = None
        self.batched_beats: bool | None = None
        #: the Idempotency-Key of a claim that got no answer, sent again with the next claim
        #: (``_claim_once``); None after an answer
        self._claim_key: str | None = None
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, int], JobRun] = {}
        self._used: tuple[int, int] = (0, 0)  # CPUs and GPUs the running attempts hold
        self._accepting = True
        self._registered = False
        self._register_lock = threading.Lock()
        self.stopping = threading.Event()
        #: set when the server refused the registration for good (``refused_for_good``):
        #: ``refusal`` says why, in the server's words, and the worker exits
        self.refused = threading.Event()
        self.refusal = ""
        self._heartbeat_stop = threading.Event()
        self._heartbeat_wake = threading.Event()
        self._unhealthy_gpus: set[int] = set()
        self._told_no_lease = False
        self.samplers = self._open_samplers()
        #: who jobs run as: their user's account where the worker is root and its server has auth
        #: (the worker has a token), else the worker's own
        self.accounts = identity.Accounts(
            switching=os.geteuid() == 0 and bool(os.environ.get("CORRAL_TOKEN", "").strip()),
            user_map=identity.parse_user_map(settings.user_map),
        )
        #: a cgroup per attempt, where the host has them and the settings do not turn it off
        state_dir = leftovers.state_directory(settings.state_dir, worker_id)
        self.containment: cgroups.Containment | None = None
        self._containment_line = "containment off (--containment none): jobs run without limits"
        if settings.containment != "none":
            self.containment, self._containment_line = cgroups.detect(
                cgroups.subtree_name(worker_id, state_dir)
            )
        self._gpu_devices = gpu_device_numbers(settings.gpu_devices)
        self._enforcement: dict[str, str] = {}
        self.records = leftovers.ProcessRecords(state_dir)
        self._job_threads = ThreadPool("job")
        self._claim_thread = threading.Thread(target=self._claim_loop, name="claim", daemon=True)
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)

    def start(self) -> None:
        logger.info(
            "worker starting",
            extra={
                **self.fields,
                "server": self.settings.server,
                "address": self.address,
                "resources": self.offer.resources(),
                "gpu_model": self.offer.gpu_model,
                "labels": self.offer.labels,
            },
        )
        # Before any claim: what a killed run of this worker left must not run beside new work.
        self._start_containment()
        stopped = self.records.stop_leftovers(self.settings.preempt_grace_s)
        spills = log_shipper.clear_spills(log_shipper.spill_directory(self.records.directory))
        if spills:
            logger.info(
                "removed log spill files left by this worker's previous run",
                extra={**self.fields, "count": spills},
            )
        if stopped:
            logger.warning(
                "stopped jobs left running by this worker's previous run",
                extra={**self.fields, "job_ids": [record.job_id for record in stopped]},
            )
        self._claim_thread.start()
        self._heartbeat_thread.start()

    def _start_containment(self) -> None:
        """Make the worker's cgroup subtrees (killing what a killed predecessor left in them) and
        say, in one line, what this host enforces."""
        if self.containment is not None:
            try:
                killed = self.containment.start()
            except OSError as error:
                logger.error(
                    "cannot use the host's cgroups; jobs run without limits",
                    extra={**self.fields, "error": str(error)},
                )
                self.containment = None
            else:
                if killed:
                    logger.warning(
                        "killed processes a previous run of this worker left in its cgroups",
                        extra={**self.fields, "pids": killed},
                    )
        logger.info(
            self._containment_line,
            extra={**self.fields, "enforcement": self.enforcement()},
        )

    def enforcement(self) -> dict[str, str]:
        """API.md's ``enforcement``: the mechanism in use for each, or ``none`` (known once the
        containment started: before, nothing is said to be held)."""
        limits = self.containment.enforcement if self.containment is not None else {}
        self._enforcement = {
            "identity": self.accounts.enforcement,
            **{key: limits.get(key, "none") for key in cgroups.ENFORCEMENT_KEYS},
        }
        return self._enforcement

    def _open_samplers(self) -> Samplers:
        """The GPU sampler the settings name; NVML is only tried by default when GPUs are offered.

        Without one on a GPU worker, the stall watchdog confirms on memory alone and the GPU-health
        watchdog is off: said once, here.
        """
        setting = self.settings.gpu_sampler
        gpu = None
        if setting is not None or self.offer.gpus > 0:
            gpu, message = open_gpu_sampler(setting)
            if gpu is not None:
                logger.info(message, extra=self.fields)
            elif self.offer.gpus > 0 or setting == "nvml":
                logger.warning(
                    f"{message}; GPU confirmation is unavailable: the stall watchdog confirms on memory "
                    "alone and the GPU-health watchdog is off",
                    extra=self.fields,
                )
        return Samplers(gpu=gpu, memory=ProcessTreeSampler())

    def running_job_ids(self) -> list[str]:
        """What the worker advertises: its attempts, less those a watchdog tripped."""
        with self._lock:
            return sorted({job_id for (job_id, _attempt), run in self._runs.items() if not run.tripped})

    def unhealthy_gpus(self) -> list[int]:
        with self._lock:
            return sorted(self._unhealthy_gpus)

    # --- registration ----------------------------------------------------------------------

    def register(self) -> bool:
        """Register (an upsert on the server); False when the server could not be told."""
        body: dict[str, Any] = {
            "id": self.worker_id,
            "address": self.address,
            "resources": self.offer.resources(),
            "gpu_model": self.offer.gpu_model,
            "labels": self.offer.labels,
            "enforcement": self.enforcement(),
        }
        with self._register_lock:
            try:
                self._api.register_worker(body)
            except ServerUnreachable as error:
                logger.warning(
                    "cannot register: server unreachable", extra={**self.fields, "error": str(error)}
                )
                return False
            except ApiError as error:
                if refused_for_good(error):
                    # Asking again would get the same answer for ever (``--gpus 2000000``, a bad
                    # token): the worker stops, with the server's message (``corral.worker.main``).
                    self.refusal = f"{error.code}: {error.message}"
                    self.refused.set()
                    self.stopping.set()
                    return False
                logger.warning(
                    "registration refused", extra={**self.fields, "code": error.code, "error": str(error)}
                )
                return False
            self._registered = True
        logger.info("worker registered", extra=self.fields)
        return True

    def _forget_registration(self, why: str) -> None:
        logger.warning(f"{why}; registering again", extra=self.fields)
        self._registered = False

    # --- the claim loop --------------------------------------------------------------------

    def _claim_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self._claim_once()
            except Exception:
                logger.exception("claim loop error", extra=self.fields)
                self.stopping.wait(self.settings.poll_s)

    def _claim_once(self) -> None:
        if not self._registered and not self.register():
            self.stopping.wait(self.settings.poll_s)
            return
        # Short long-polls (2 s by default) let the claim loop see a shutdown within that time;
        # they cost one HTTP round trip per interval and nothing in latency (a submit wakes them).
        wait_s = self.settings.claim_wait_s
        # A claim that got no answer may have started runs on the server (it applied the claim,
        # then died or lost the connection): the next claim carries the same key, and the server
        # answers those runs again rather than leave them to be lost with their lease.
        if self._claim_key is None:
            self._claim_key = secrets.token_hex(16)
        # The runs this claim answers start their leases (and the self-fence's count, ``JobRun``)
        # no earlier than this. A retried key may answer runs its first try started, earlier: but
        # every outage leaves a key to retry, and counting from the first try fenced the first
        # job a restarted server handed out at once (bench/self_fence.py); such a run is renewed
        # by the worker's next heartbeat anyway, within a heartbeat of this answer.
        sent_at = time.monotonic()
        try:
            claims = self._claim(wait_s, self._claim_key)
            # the try the server answered: a 503 store_busy is tried again inside the call, and a
            # stall longer than the fence's delay must not fence the runs it then starts
            sent_at = max(sent_at, self._claims.last_sent_at or sent_at)
        except ServerUnreachable as error:
            logger.warning("claim failed: server unreachable", extra={**self.fields, "error": str(error)})
            self.stopping.wait(self.settings.poll_s)
            return
        except ApiError as error:
            if error.status < 500:
                self._claim_key = None  # refused: nothing was started
            if error.status == 404:
                self._forget_registration("the server does not know this worker")
                self.stopping.wait(self.settings.poll_s)
                return
            if error.code == "bad_response" and error.status == 200:
                self._refuse_claim(error)
                return
            logger.warning("claim failed", extra={**self.fields, "code": error.code, "error": str(error)})
            self.stopping.wait(self.settings.poll_s)
            return
        self._claim_key = None
        if not claims:
            if wait_s <= 0:
                self.stopping.wait(self.settings.poll_s)
            return
        for claim in claims:
            if isinstance(claim, ApiError):
                self._refuse_claim(claim)
            else:
                self._start_job(claim, sent_at)

    def _claim(self, wait_s: float, key: str | None = None) -> list[ClaimAnswer | ApiError]:
        """Claim up to what the free capacity could hold, all at once where the server can;
        ``key`` is the claim's Idempotency-Key."""
        room = self.claim_room()
        if self.multi_claim is not False and room > 1:
            try:
                claimed = self._claims.claim_several(self.worker_id, wait_s, room, key)
            except ApiError as error:
                if error.status != 400:
                    raise
                self._no_multi_claim(f"{error.code}: {error.message}")
            else:
                if claimed.understood:
                    self.multi_claim = True
                else:
                    self._no_multi_claim("it answered one plain claim")
                return claimed.items
        claim = self._claims.claim(self.worker_id, wait_s=wait_s, idempotency_key=key)
        return [] if claim is None else [claim]

    def _no_multi_claim(self, why: str) -> None:
        if self.multi_claim is not False:
            logger.info(
                "the server does not claim several jobs at once (max); claiming one at a time",
                extra={**self.fields, "why": why},
            )
        self.multi_claim = False

    def claim_room(self) -> int:
        """How many jobs the free capacity could hold, as far as the worker can tell before it
        sees them: free CPUs or free GPUs, whichever is more, between 1 and ``CLAIM_BATCH``. The
        server decides what really fits; this only bounds a claim."""
        with self._lock:
            used_cpus, used_gpus = self._used
        free_cpus = self.offer.cpus - used_cpus
        free_gpus = self.offer.gpus - used_gpus
        return max(1, min(CLAIM_BATCH, MAX_CLAIM, max(free_cpus, free_gpus)))

    def _start_job(self, claim: ClaimAnswer, claim_sent_at: float | None = None) -> None:
        """Run a claimed attempt; ``claim_sent_at``: when its claim was sent (monotonic)."""
        with self._lock:
            if (claim.id, claim.attempt) in self._runs:
                # A claim answered again (its key retried) for a run this worker already has.
                logger.warning(
                    "claim answered a run already running here; ignored",
                    extra={**self.fields, "job_id": claim.id, "attempt": claim.attempt},
                )
                return
        run = JobRun(
            claim,
            self._api,
            self.settings,
            self.worker_id,
            self._job_finished,
            samplers=self.samplers,
            on_tripped=self._job_tripped,
            on_gpus_unhealthy=self._gpus_unhealthy,
            records=self.records,
            kept_by_agent=True,
            threads=self._job_threads,
            accounts=self.accounts,
            containment=self.containment,
            gpu_devices=self._gpu_devices,
            lease_from=claim_sent_at,
            final_reports=self._final_reports,
        )
        if run.fence is None and self.settings.self_fence and claim.lease_s is None:
            self._no_lease_said()
        with self._lock:
            accepted = self._accepting
            if accepted:
                self._runs[(run.job_id, run.attempt)] = run
                self._count(run, 1)
        if not accepted:
            # Claimed after shutdown stopped waiting for the claim loop: hand it straight back.
            logger.warning("job claimed during shutdown; handing it back", extra=run.fields)
            deliver(
                lambda: self._api.fail(
                    run.job_id, self.worker_id, run.attempt, None, SHUTDOWN_ERROR, "", release=True
                ),
                "fail report",
                run.fields,
            )
            return
        # At debug level: the attempt's "job started" line carries the command (one line fewer per
        # job, on a worker running hundreds a second).
        logger.debug("job claimed", extra={**run.fields, "command": run.command})
        run.start()

    def _no_lease_said(self) -> None:
        """Said once: a server that does not say its lease (older than the self-fence) leaves its
        jobs unfenced."""
        if not self._told_no_lease:
            self._told_no_lease = True
            logger.warning(
                "the server does not say its lease (lease_s) in its claims: this worker's jobs run "
                "without the self-fence",
                extra=self.fields,
            )

    def _refuse_claim(self, malformed: ApiError) -> None:
        """A claim the worker cannot read (it breaks the wire contract): fail it, spending the
        attempt, as the next claim of the same answer would fail the same way, rather than leave it
        running until its lease expires. Its id and attempt are read off the raw answer when usable."""
        raw = malformed.body if isinstance(malformed.body, dict) else {}
        job_id = raw.get("id") if isinstance(raw.get("id"), str) and raw.get("id") else None
        attempt = raw.get("attempt")
        if isinstance(attempt, bool) or not isinstance(attempt, int):
            attempt = None
        fields = {**self.fields, "job_id": job_id, "attempt": attempt, "error": malformed.message}
        if job_id is None or attempt is None:
            logger.error("malformed claim without a usable id and attempt; ignored", extra=fields)
            return
        logger.error("malformed claim; reporting it failed", extra=fields)
        deliver(
            lambda: self._api.fail(
                job_id, self.worker_id, attempt, None, f"malformed claim: {malformed.message}", ""
            ),
            "fail report",
            fields,
        )

    def _job_finished(self, run: JobRun) -> None:
        """Forget the run, unless its key already belongs to another run. Attempt numbers only
        grow, so that should never be; but a gang task is claimed again within moments of its
        drain's ack, possibly on this worker before the acking run has finished, and a mix-up
        there would hide the new run from the worker heartbeat and from shutdown."""
        key = (run.job_id, run.attempt)
        with self._lock:
            if self._runs.get(key) is run:
                del self._runs[key]
                self._count(run, -1)

    def _count(self, run: JobRun, sign: int) -> None:
        """Called with the lock held: what the running attempts hold, kept as they start and end
        (``claim_room``, asked before every claim, no longer sums over every running job)."""
        cpus, gpus = self._used
        self._used = (cpus + sign * run.claim.resources.cpus, gpus + sign * len(run.claim.gpu_indices))

    def _job_tripped(self, run: JobRun) -> None:
        """Stop advertising the job now (``running_job_ids`` skips it) and say so at once."""
        self._heartbeat_wake.set()

    def _gpus_unhealthy(self, run: JobRun) -> None:
        with self._lock:
            new = sorted(set(run.gpu_indices) - self._unhealthy_gpus)
            self._unhealthy_gpus.update(run.gpu_indices)
            unhealthy = sorted(self._unhealthy_gpus)
        if new:
            logger.error(
                "GPUs marked unhealthy: the job's process survived SIGKILL; no more work on them",
                extra={**run.fields, "gpu_indices": new, "unhealthy_gpus": unhealthy},
            )
        # Now, before the job's report frees its GPUs on the server: a wake-up of the heartbeat
        # thread could lose that race and let the server place new work on them.
        try:
            self._worker_beat(None)
        except Exception:
            logger.exception("worker heartbeat error", extra=self.fields)

    # --- the worker heartbeat --------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        """Every ``heartbeat_s``: the running attempts' leases, in the worker heartbeat where the
        server takes them; the worker heartbeat alone every ``worker_heartbeat_s`` otherwise, or
        at once when woken (a watchdog trip)."""
        next_worker_beat = time.monotonic() + self.settings.worker_heartbeat_s
        while True:
            woken = self._heartbeat_wake.wait(
                min(self.settings.heartbeat_s, self.settings.worker_heartbeat_s)
            )
            self._heartbeat_wake.clear()
            if self._heartbeat_stop.is_set():
                return
            worker_due = woken or time.monotonic() >= next_worker_beat
            try:
                if self._heartbeat_once(worker_due):
                    next_worker_beat = time.monotonic() + self.settings.worker_heartbeat_s
            except Exception:
                logger.exception("worker heartbeat error", extra=self.fields)

    def heartbeat_body(self) -> dict[str, Any]:
        """Alive, running these jobs (the server re-queues at once a job it holds here that the list
        leaves out and that stopped heartbeating), these GPUs unusable, each GPU reading so."""
        body: dict[str, Any] = {"running": self.running_job_ids()}
        if self._enforcement:
            body["enforcement"] = self._enforcement
        unhealthy = self.unhealthy_gpus()
        if unhealthy:
            body["unhealthy_gpus"] = unhealthy
        if self.samplers.gpu is not None and self.offer.gpus > 0:
            try:
                readings = self.samplers.gpu.read_devices(range(self.offer.gpus))
            except Exception:
                logger.debug("GPU readings for the worker heartbeat failed", extra=self.fields, exc_info=True)
                readings = []
            body["gpus"] = [
                {"index": reading.index, "util_pct": round(min(100.0, max(0.0, reading.util_pct)), 1)}
                | (
                    {"mem_used_mb": round(reading.memory_used_mb, 1)}
                    if reading.memory_used_mb is not None
                    else {}
                )
                for reading in readings
            ]
        return body

    def _heartbeat_once(self, worker_due: bool = True) -> bool:
        """One round of the heartbeat thread; True when the worker heartbeat went out."""
        if not self._registered:
            return False
        leases = self._lease_requests()
        if self.batched_beats is False or not leases:
            sent = worker_due and self._worker_beat(None) is True
            self._job_beats(leases)
            return sent
        batch, rest = self._one_per_job(leases)
        if self._worker_beat(batch) is None:
            # Not understood, or no answer: each lease by its own heartbeat, this round already.
            self._job_beats(batch)
        self._job_beats(rest)
        return True

    def _lease_requests(self) -> list[tuple[JobRun, BeatRequest]]:
        """Each running attempt that wants its lease kept, with what its heartbeat says."""
        leases = []
        for run in self._snapshot():
            try:
                request = run.beat_request()
            except Exception:
                logger.exception("job heartbeat error", extra=run.fields)
                continue
            if request is not None:
                leases.append((run, request))
        return leases

    @staticmethod
    def _one_per_job(
        leases: list[tuple[JobRun, BeatRequest]],
    ) -> tuple[list[tuple[JobRun, BeatRequest]], list[tuple[JobRun, BeatRequest]]]:
        """The batch answers by job id: two attempts of one job (a gang task claimed again here
        while its previous attempt ends) cannot share it; the older goes by its own heartbeat."""
        newest: dict[str, tuple[JobRun, BeatRequest]] = {}
        rest = []
        for lease in sorted(leases, key=lambda lease: -lease[0].attempt):
            if lease[0].job_id in newest:
                rest.append(lease)
            else:
                newest[lease[0].job_id] = lease
        return list(newest.values()), rest

    def _job_beats(self, leases: list[tuple[JobRun, BeatRequest]]) -> None:
        """One job heartbeat per attempt (a server without the batched body), one after another."""
        for run, request in leases:
            try:
                run.heartbeat(request)
            except Exception:
                # A heartbeat must never end a healthy job.
                logger.exception("job heartbeat error", extra=run.fields)

    def _worker_beat(self, leases: list[tuple[JobRun, BeatRequest]] | None) -> bool | None:
        """The worker heartbeat, with ``leases`` in its body when given. Without leases: whether
        it went out. With them: True when every lease's answer was dispatched to its attempt,
        None when the leases still need their own heartbeats (the server did not take the batch,
        or a body of one job was refused), False when the heartbeat failed (unreachable, unknown
        worker: nothing more to send this round)."""
        body = self.heartbeat_body()
        if leases:
            body["jobs"] = [
                {"id": run.job_id, "attempt": run.attempt, **request.body} for run, request in leases
            ]
        try:
            answer = self._api.worker_beat(self.worker_id, body)
        except ServerUnreachable as error:
            # One line for the worker and its leases; a deferral goes again with the next beat.
            logger.warning(
                "worker heartbeat failed: server unreachable",
                extra={**self.fields, "error": str(error), "leases": len(leases or ())},
            )
            return False
        except ApiError as error:
            if error.status == 404:
                self._forget_registration("the server does not know this worker")
                self.register()
                return False
            if leases and error.status == 400:
                if "jobs" in error.message and self.batched_beats is None:
                    self._no_batched_beats(f"{error.code}: {error.message}")
                else:
                    logger.warning(
                        "batched heartbeat refused; each job heartbeats on its own this time",
                        extra={**self.fields, "code": error.code, "error": error.message},
                    )
                # The worker itself was not heartbeated either.
                self._worker_beat(None)
                return None
            logger.warning(
                "worker heartbeat failed", extra={**self.fields, "code": error.code, "error": str(error)}
            )
            if heard_through_a_stall(error.status, error.code):
                for run, request in leases or ():
                    run.heard_in_a_stall(request)
            return False
        if not leases:
            return True
        if answer is None:
            self._no_batched_beats("its answer has no per-job answers")
            return None
        self.batched_beats = True
        self._dispatch(leases, answer)
        return True

    def _no_batched_beats(self, why: str) -> None:
        if self.batched_beats is not False:
            logger.info(
                "the server does not take job heartbeats in the worker heartbeat; one per job",
                extra={**self.fields, "why": why},
            )
        self.batched_beats = False

    def _dispatch(self, leases: list[tuple[JobRun, BeatRequest]], answer: WorkerHeartbeatAnswer) -> None:
        """Each attempt gets its job's answer as its own heartbeat would have: an action, or the
        refusal (``stale_attempt``, ``not_running``, ``not_found``: the attempt stops)."""
        answers = answer.jobs or {}
        for run, request in leases:
            item = answers.get(run.job_id)
            try:
                if item is None:
                    logger.warning("the worker heartbeat's answer left the job out", extra=run.fields)
                elif item.error is not None:
                    status = 404 if item.error.code == "not_found" else 409
                    run.beat_refused(request, ApiError(status, item.error.code, item.error.message))
                else:
                    run.beat_answered(request, item)
            except Exception:
                logger.exception("job heartbeat error", extra=run.fields)

    # --- shutdown --------------------------------------------------------------------------

    def shutdown(self, force: threading.Event) -> None:
        """Stop claiming, give running jobs ``shutdown_timeout_s`` to finish, stop the rest.

        1. Stop the claim loop (it notices within a claim slice); a job it claims meanwhile runs.
        2. Wait for the running jobs, up to ``shutdown_timeout_s`` or until ``force`` is set
           (a second signal).
        3. Stop what is still running (SIGTERM, grace, SIGKILL) and hand each back (a ``fail`` with
           ``release``, "worker shut down"), so the server re-queues it at once instead of after
           its lease, without spending its attempt.
        """
        self.stopping.set()
        self._claim_thread.join(timeout=CLAIM_JOIN_S)
        with self._lock:
            self._accepting = False
        running = self._snapshot()
        if running:
            logger.info(
                "shutting down: waiting for running jobs",
                extra={**self.fields, "running": len(running), "timeout_s": self.settings.shutdown_timeout_s},
            )
        deadline = time.monotonic() + self.settings.shutdown_timeout_s
        while self._snapshot() and not force.is_set() and time.monotonic() < deadline:
            force.wait(min(0.1, max(0.0, deadline - time.monotonic())))
        remaining = self._snapshot()
        for run in remaining:
            run.request_stop(StopReason.SHUTDOWN)
        allowance = self.settings.preempt_grace_s + REPORT_ALLOWANCE_S
        for run in remaining:
            if not run.finished.wait(allowance):
                logger.error("job did not finish its stop in time", extra=run.fields)
        self._heartbeat_stop.set()
        self._heartbeat_wake.set()
        self._heartbeat_thread.join(timeout=API_TIMEOUT_S)
        self._leave()
        self._claims.close()
        self._api.close()
        if self.samplers.gpu is not None:
            self.samplers.gpu.close()
        if self.containment is not None:
            self.containment.shutdown()
        logger.info("worker stopped", extra=self.fields)

    def _leave(self) -> None:
        """Tell the server this worker is gone (``POST /workers/{id}/leave``), so it shows offline
        at once instead of after ``CORRAL_WORKER_OFFLINE_S`` of silence. Best effort: a server that
        cannot be reached (or an older one without the route) leaves it to that timer."""
        try:
            self._api.leave_worker(self.worker_id)
        except ClientError as error:
            logger.warning(
                "could not tell the server this worker is leaving", extra={**self.fields, "error": str(error)}
            )

    def _snapshot(self) -> list[JobRun]:
        with self._lock:
            return list(self._runs.values())
