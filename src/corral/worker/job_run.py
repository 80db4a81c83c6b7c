"""One claimed attempt, from start to report: the process, its watchdogs, its stop, its outcome.

Each attempt has its own thread (on a worker, one of the agent's reused threads,
``corral.worker.threads``), so a slow report or a long stop of one job never delays another.
The thread owns the decision of what to report; other threads (the agent at shutdown, the
heartbeat answer) and the job's watchdogs only ask for a stop with a reason, and the first reason
wins, except that losing the job (409) overrides everything: a job that is no longer ours is never
reported on.

The attempt's lease is kept by heartbeats from outside its thread, from the claim until its report
goes out: on a worker, by the agent's one heartbeat thread, which renews every running attempt's
lease in one worker heartbeat (``beat_request`` / ``beat_answered`` / ``beat_refused``), or one job
heartbeat each for a server that does not know the batched body (``heartbeat``); an attempt run on
its own (``kept_by_agent`` False: tests, tools) has a heartbeat thread of its own that calls
``heartbeat``. So the attempt's thread never waits for a heartbeat, and drives the job's watchdogs
itself (``corral.worker.job_watch``) while it waits for the process to exit.

A watchdog trip is reported as ``POST /jobs/{id}/watchdog`` with what the watchdog saw, and never
also as done or failed: the server decides between a re-queue and a failure. If the job's process
had already ended on its own when the stop began, its own outcome is reported instead: the trip
raced with the exit and stopped nothing.

Every end of an attempt but a lost job uploads the checkpoint the job left at
``CORRAL_CHECKPOINT_OUT``, after its process group is gone and before the final report, with the
lease kept alive by heartbeats meanwhile: a stop the server asked for (``preempt`` on the
heartbeat, epoch N) uploads for epoch N, then acks ``/preempted?epoch=N``; an exit of its own
(done or a crash, even while the gang drains), a watchdog trip and a shutdown hand-back upload
without an epoch, then report done, fail or the trip (``corral.worker.checkpoints`` says why, and
why in that order). Before the process starts, the job's own checkpoint is fetched to
``CORRAL_CHECKPOINT_IN``, and for a gang rank every rank's into ``CORRAL_GANG_CHECKPOINT_DIR``.

A ``checkpoint`` answer (epoch N) starts that epoch's checkpoint phase once
(``corral.worker.checkpoint_phase``): SIGUSR1 to the job's group, the job's "saved", an upload for
epoch N; the ``preempt`` answer that follows is an ordinary stop. The heartbeats carry what the
server needs meanwhile: ``checkpoint_at`` (when the job last saved) always, ``defer_s`` once per
request for more time the job makes during the phase.

A job with a ``walltime_s`` is ended at it (``corral.worker.walltime``): the attempt's thread ticks
the limit beside the watchdogs; a job that checkpoints gets a checkpoint phase without an epoch
``CORRAL_WALLTIME_WARNING_S`` before (the hint, its save, an upload), then the stop (SIGTERM, grace,
SIGKILL), its checkpoint uploaded as at every end, and the report a failure with reason
``walltime_exceeded``, which the server does not retry.

The job's output goes to the server as it is written (``corral.worker.log_shipper``), and what is
left of it once the process ended before the checkpoint upload and the report.

The self-fence (``corral.worker.fence``, ``--self-fence``): every renewed lease moves the
attempt's fence; the attempt's thread, which already waits for its process, also wakes when the
fence is due and stops the job as a preemption does (``FENCED``: a checkpointing job is hinted and
given the margin to save, then SIGTERM, grace, SIGKILL). The attempt then hands the job back
(``fail`` with ``release``) once the server answers again: a server that was down takes it (and the
checkpoint uploaded before it); one that re-queued the job meanwhile answers 409 ``stale_attempt``
and the report is dropped, as every stale report is.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from corral.client_errors import ApiError, ServerUnreachable
from corral.config import WorkerSettings
from corral.protocol.answers import ClaimAnswer, HeartbeatAnswer
from corral.worker import checkpoints, identity, job_files, leftovers, log_shipper
from corral.worker.calls import WorkerClient
from corral.worker.cgroup_limits import attempt_limits
from corral.worker.cgroups import AttemptGroup, Containment, JoinError
from corral.worker.checkpoint_phase import HINT_SIGNAL, CheckpointPhase, Deferral
from corral.worker.executor import JobProcess
from corral.worker.fence import HEARTBEAT_BUSY_RETRY_S, LeaseFence, heard_through_a_stall
from corral.worker.final_reports import FinalReports
from corral.worker.job_watch import ERROR_PAUSE_S, MIN_WAIT_S, JobProbe, JobWatch, build_watch
from corral.worker.leftovers import ProcessRecords
from corral.worker.reporting import deliver_outcome
from corral.worker.samplers import Samplers
from corral.worker.threads import ThreadPool
from corral.worker.walltime import Step, WalltimeLimit, walltime_limit
from corral.worker.watchdogs import Verdict
from corral.worker.workspace import JobWorkspace

logger = logging.getLogger("corral.worker.job")

SHUTDOWN_ERROR = "worker shut down"
FENCED_ERROR = "stopped by its worker's self-fence: the lease could not be renewed in time"

#: how long the attempt's thread waits for its process at a time when no watchdog is due sooner
SUPERVISE_SLICE_S = 60.0
#: the job's watchdogs are built only once it has run this long: most jobs of a busy worker end
#: sooner, and building them (a probe, two or three watchdogs, their beat file) was a tenth of such
#: a job's cost to the worker. They are started with the job's start time, so a budget still
#: counts from the spawn; a trip is at most this late.
WATCH_AFTER_S = 0.05
#: how often a fenced job's save is looked for
FENCE_SAVE_POLL_S = 0.1


class StopReason(enum.Enum):
    PREEMPT = "preempt"  # the server asked (preemption, cancel, gang drain): ack with the epoch
    LOST = "lost"  # 409/404: another attempt owns the job; report nothing
    SHUTDOWN = "shutdown"  # the worker is going away: report a failure so the job is re-queued
    WATCHDOG = "watchdog"  # a watchdog tripped: report the trip, the server re-queues or fails
    WALLTIME = "walltime"  # its walltime_s is reached: report a failure the server does not retry
    FENCED = "fenced"  # the lease could not be renewed in time: hand the job back (release)


def _saved_at(path: Path) -> float | None:
    """When the job last saved a checkpoint (epoch seconds), from one ``stat``; None when it has
    none (no file, or an empty one)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    # The job sets the time as it likes (``touch -d``): one no heartbeat can carry is left out.
    return job_files.sane_time(round(status.st_mtime, 3)) if status.st_size > 0 else None


@dataclass(frozen=True)
class BeatRequest:
    """One heartbeat of an attempt: its body, and the deferral it carries (with the checkpoint
    phase that asked for it), to be marked sent once the server had the request."""

    body: dict[str, Any]
    phase: CheckpointPhase | None = None
    deferral: Deferral | None = None
    #: when the heartbeat was made (monotonic), just before it went out: an answer renews the
    #: attempt's lease as of then (``LeaseFence.renewed``)
    sent_at: float = field(default_factory=time.monotonic)


def describe_exit(exit_code: int) -> str:
    if exit_code > 128:
        try:
            return f"killed by signal {signal.Signals(exit_code - 128).name}"
        except ValueError:
            pass
    return f"exited with code {exit_code}"


class JobRun:
    def __init__(
        self,
        claim: ClaimAnswer,
        client: WorkerClient,
        settings: WorkerSettings,
        worker_id: str,
        on_finished: Callable[[JobRun], None],
        samplers: Samplers | None = None,
        on_tripped: Callable[[JobRun], None] | None = None,
        on_gpus_unhealthy: Callable[[JobRun], None] | None = None,
        records: ProcessRecords | None = None,
        kept_by_agent: bool = False,
        threads: ThreadPool | None = None,
        accounts: identity.Accounts | None = None,
        containment: Containment | None = None,
        gpu_devices: dict[int, tuple[int, int]] | None = None,
        lease_from: float | None = None,
        final_reports: FinalReports | None = None,
    ) -> None:
        """``lease_from``: when the claim that started this attempt was sent (monotonic), the
        fence's first renewal; by default, now. ``final_reports``: the worker's batches of final
        reports, which the done or fail report joins (None: sent by its own route)."""
        self.claim = claim
        self.job_id, self.attempt, self.command = claim.id, claim.attempt, claim.command
        self.gpu_indices, self.claim_env = list(claim.gpu_indices), dict(claim.env)
        self.fields = {"job_id": self.job_id, "worker_id": worker_id, "attempt": self.attempt}
        self._client = client
        self._settings = settings
        self._worker_id = worker_id
        self._on_finished = on_finished
        self._final_reports = final_reports
        self._samplers = samplers
        self._on_tripped = on_tripped
        self._on_gpus_unhealthy = on_gpus_unhealthy
        self._records = records  # the job's process group, kept while it runs (worker.leftovers)
        self._watch: JobWatch | None = None
        self._probe: JobProbe | None = None
        self.verdict: Verdict | None = None
        self._lock = threading.Lock()
        self._reason: StopReason | None = None
        self._epoch: int | None = None
        self._process: JobProcess | None = None
        self._shipper: log_shipper.LogShipper | None = None
        self._stopper: threading.Thread | None = None
        self._workspace: JobWorkspace | None = None
        self._uploads: checkpoints.AttemptUploads | None = None
        self._phase: CheckpointPhase | None = None  # the latest epoch's checkpoint phase
        self._checkpoint_epochs_seen: set[int] = set()
        self._reported = False  # a report (or the first try of one) went out: never send another
        self._watching = False  # the attempt's thread ticks the watchdogs
        self.finished = threading.Event()
        self._kept_by_agent = kept_by_agent
        self._threads = threads  # the agent's reused threads; None: a thread of its own
        self._accounts = accounts or identity.Accounts(switching=False)  # who the job runs as
        self._containment = containment  # a cgroup per attempt, where the host has them
        self._gpu_devices = gpu_devices or {}
        self._cgroup: AttemptGroup | None = None
        # the limit counts from the claim, as the server's ``deadline_at`` does
        self._claimed_at = time.monotonic()
        self._limit: WalltimeLimit | None = walltime_limit(settings, claim.walltime_s, claim.checkpoint_mode)
        self._walltime_phase: CheckpointPhase | None = None
        #: the self-fence, where the settings turn it on and the server said its lease
        self.fence: LeaseFence | None = None
        if settings.self_fence and claim.lease_s is not None and claim.lease_s > 0:
            renewed_at = time.monotonic() if lease_from is None else lease_from
            self.fence = LeaseFence(claim.lease_s, settings.self_fence_margin_s, renewed_at)

    def start(self) -> None:
        name = f"job-{self.job_id}"
        if self._threads is not None:
            self._threads.submit(self._run, name)
        else:
            threading.Thread(target=self._run, name=name, daemon=True).start()
        if not self._kept_by_agent:
            threading.Thread(target=self._beat_alone, name=f"beat-{self.job_id}", daemon=True).start()

    # --- stopping --------------------------------------------------------------------------

    @property
    def tripped(self) -> bool:
        """A watchdog stopped (or is stopping) this attempt: the worker no longer advertises it."""
        return self.verdict is not None

    def request_stop(self, reason: StopReason, epoch: int | None = None) -> None:
        """Stop the job (SIGTERM, grace, SIGKILL) in the background; the first reason is kept."""
        if self._watch is not None:
            self._watch.stop()
        self._end_phase(f"stop: {reason.value}")
        with self._lock:
            if reason == StopReason.LOST or self._reason is None:
                self._reason = reason
            if reason == StopReason.PREEMPT and epoch is not None:
                # Even while another stop (shutdown, watchdog) is under way: the server is waiting
                # for this epoch's ack.
                self._epoch = epoch
            self._start_stopper()

    def _start_stopper(self) -> None:
        """Called with the lock held; starts the stop once the process exists."""
        if self._stopper is not None or self._process is None or self._reason is None:
            return
        stop = self._stop_fenced if self._reason == StopReason.FENCED else self._process.stop
        self._stopper = threading.Thread(target=stop, name=f"stop-{self.job_id}", daemon=True)
        self._stopper.start()
        logger.info("stopping job", extra={**self.fields, "reason": self._reason.value})

    def _fence_wait_s(self) -> float | None:
        """How long until the fence is due; None when there is none to watch (no fence, or the
        job is being stopped already)."""
        with self._lock:
            stopping = self._reason is not None
        if self.fence is None or stopping:
            return None
        return self.fence.deadline() - time.monotonic()

    def _check_fence(self) -> None:
        """From the attempt's thread: stop the job if its lease went unrenewed for too long,
        unless something else already stops it."""
        fence = self.fence
        if fence is None or not fence.due():
            return
        with self._lock:
            if self._reason is not None:
                return
        logger.warning(
            "lease not renewed in time; stopping the job (self-fence): the server may be giving it "
            "to another worker",
            extra={
                **self.fields,
                "silent_s": round(fence.silent_s(), 3),
                "lease_s": fence.lease_s,
                "margin_s": fence.margin_s,
            },
        )
        self.request_stop(StopReason.FENCED)

    def _stop_fenced(self) -> None:
        """The fence's stop, as a preemption's: a job that checkpoints is hinted (SIGUSR1) and given
        the margin to say it saved, then SIGTERM, the grace, SIGKILL. What it saved is uploaded
        with the attempt's end, and kept if this attempt is still the job's (the server was down,
        not cut off)."""
        process, workspace, fence = self._process, self._workspace, self.fence
        assert process is not None
        if self.claim.checkpoint_mode != "none" and workspace is not None and fence is not None:
            done_file = workspace.checkpoint_done_file
            with contextlib.suppress(OSError):
                done_file.unlink(missing_ok=True)
            if process.hint(HINT_SIGNAL) == "sent":
                logger.info("checkpoint hint sent (SIGUSR1) before the fenced stop", extra=self.fields)
                deadline = time.monotonic() + fence.margin_s
                while time.monotonic() < deadline and not done_file.exists():
                    if process.wait(FENCE_SAVE_POLL_S) is not None:
                        break
        process.stop()

    def _watchdog_tripped(self, verdict: Verdict) -> None:
        """From the attempt's thread: stop the job unless something else already is."""
        with self._lock:
            first = self._reason is None
            if first:
                self._reason = StopReason.WATCHDOG
                self.verdict = verdict
        if not first:
            return
        logger.warning(
            "watchdog tripped; stopping the job",
            extra={**self.fields, "watchdog": verdict.kind, "detail": verdict.detail},
        )
        if self._on_tripped is not None:
            self._on_tripped(self)
        self.request_stop(StopReason.WATCHDOG)

    def _start_watch(self, process: JobProcess, workspace: JobWorkspace, started_at: float) -> None:
        if self._samplers is None:
            return
        gpu = self._samplers.gpu
        probe = JobProbe(
            process.pid,
            self._samplers.memory,
            gpu.probe(self.gpu_indices) if gpu and self.gpu_indices else None,
        )
        self._probe = probe
        self._watch = build_watch(
            self._settings,
            self.claim,
            self.gpu_indices,
            workspace.beat_file,
            probe,
            gpu.name if gpu is not None else None,
            self.fields,
        )
        with self._lock:
            stopping = self._reason is not None
        if not stopping:
            self._watch.start(started_at)
            self._watching = True

    # --- the attempt -----------------------------------------------------------------------

    def _run(self) -> None:
        workspace: JobWorkspace | None = None
        try:
            try:
                account = self._accounts.of(self.claim.user)
            except identity.NoSuchAccount as error:
                # Another attempt would meet the same host: not retried (API.md).
                logger.error("no account to run the job as", extra={**self.fields, "error": str(error)})
                self._report_failure(None, str(error), "", reason="no_such_account")
                return
            workspace = JobWorkspace(self.job_id, self.attempt, account)
            self._workspace = workspace
            self._uploads = checkpoints.AttemptUploads(
                self._client,
                self.job_id,
                self._worker_id,
                self.attempt,
                workspace.checkpoint_out,
                self.fields,
                owner=workspace.owner.uid if workspace.owner is not None else None,
            )
            workdir = self.claim.workdir
            unusable = identity.unenterable(workdir, account) if workdir is not None else None
            if unusable is not None:
                # Another attempt would meet the same directory: not retried (API.md).
                logger.error("job cannot start in its workdir", extra={**self.fields, "error": unusable})
                self._report_failure(None, unusable, "", reason="workdir_unavailable")
                return
            # Transfers can take a while for a large gang: the heartbeats keep the lease meanwhile.
            has_checkpoint = self._fetch_checkpoints(workspace)
            workspace.hand_over(workspace.checkpoint_in)
            workspace.hand_over(workspace.gang_checkpoint_dir)
            environment = workspace.environment(self.claim_env, self.gpu_indices, has_checkpoint, account)
            self._shipper = log_shipper.for_attempt(
                self._client,
                self.job_id,
                self._worker_id,
                self.attempt,
                self.fields,
                delay_s=self._settings.log_ship_delay_s,
                spill_dir=log_shipper.spill_directory(
                    leftovers.state_directory(self._settings.state_dir, self._worker_id)
                ),
                spill_max_bytes=self._settings.log_spill_max_mb * 1024 * 1024,
            )
            self._cgroup = self._open_cgroup()
            try:
                try:
                    process = self._spawn(environment, workdir or str(workspace.directory), account)
                except JoinError as error:
                    # The host refused the move into the cgroup: the job runs, without its limits.
                    logger.error(
                        "cannot put the job in its cgroup; it runs without",
                        extra={**self.fields, "error": str(error)},
                    )
                    refused, self._cgroup = self._cgroup, None
                    if self._containment is not None and refused is not None:
                        self._containment.close(refused)
                    process = self._spawn(environment, workdir or str(workspace.directory), account)
            except OSError as error:
                logger.error("job could not start", extra={**self.fields, "error": str(error)})
                self._report_failure(None, f"could not start: {error}", "")
                return
            started_at = time.monotonic()
            if self._limit is not None:
                self._limit.start(self._claimed_at)
            if self._records is not None:
                self._records.record(self.job_id, self.attempt, process.pid)
            with self._lock:
                self._process = process
                self._start_stopper()
            logger.info(
                "job started",
                extra={
                    **self.fields,
                    "pid": process.pid,
                    "gpu_indices": self.gpu_indices,
                    "command": self.command,
                },
            )
            exit_code = process.wait(max(0.0, started_at + WATCH_AFTER_S - time.monotonic()))
            if exit_code is None:
                self._start_watch(process, workspace, started_at)
                exit_code = self._supervise(process)
            self._end_phase("the job exited")
            if self._watch is not None:
                self._watch.stop()
            # The heartbeats keep the lease through a long stop of leftovers and the upload.
            tail, epoch = self._wind_down(process)
            self._report(process, exit_code, tail, epoch)
        except Exception as error:
            # A bug or a host problem (disk full for the workspace): never leave the job running
            # unsupervised, and tell the server so it can retry elsewhere instead of waiting
            # for the lease to expire.
            logger.exception("job supervision failed", extra=self.fields)
            self._end_phase("supervision failed")
            if self._process is not None:
                self._process.stop()
                self._process.close()
            with self._lock:
                lost = self._reason == StopReason.LOST
            if not lost and not self._reported:
                if self._shipper is not None:
                    self._shipper.close()
                if self._process is not None:
                    self._upload_after_error()
                self._report_failure(None, f"worker error: {error}", "")
        finally:
            if self._watch is not None:
                self._watch.stop()
            if self._shipper is not None:
                self._shipper.abandon()
            if workspace is not None:
                workspace.remove()
            if self._records is not None:
                self._records.forget(self.job_id, self.attempt)
            if self._cgroup is not None and self._containment is not None:
                self._containment.close(self._cgroup)
            self.finished.set()
            self._on_finished(self)

    def _spawn(self, environment: dict[str, str], cwd: str, account: identity.Account) -> JobProcess:
        """The job's process (no workdir: the attempt's own fresh directory, never the worker's)."""
        assert self._shipper is not None
        return JobProcess(
            self.command,
            environment,
            self._settings.output_tail_bytes,
            self._settings.preempt_grace_s,
            self.fields,
            on_output=self._shipper.write,
            cwd=cwd,
            account=account,
            cgroup=self._cgroup,
        )

    def _open_cgroup(self) -> AttemptGroup | None:
        """The attempt's cgroup, held to what its claim asked for; None where the host has none,
        or where one could not be made (the job runs without, said in a line)."""
        if self._containment is None:
            return None
        resources = self.claim.resources
        limits = attempt_limits(
            resources.memory_mb,
            resources.cpus,
            self.gpu_indices,
            self._settings.default_job_memory_mb,
            self._settings.job_pids_max,
            self._gpu_devices,
        )
        try:
            return self._containment.open(limits)
        except OSError as error:
            logger.error(
                "cannot make the job's cgroup; it runs without", extra={**self.fields, "error": str(error)}
            )
            return None

    def _fetch_checkpoints(self, workspace: JobWorkspace) -> bool:
        """Before the start: the job's own checkpoint to ``CORRAL_CHECKPOINT_IN`` (True when it is
        there), and for a gang rank every listed rank's into ``CORRAL_GANG_CHECKPOINT_DIR``."""
        has_checkpoint = checkpoints.download(
            self._client, self.job_id, self.claim_env, workspace.checkpoint_in, self.fields
        )
        if not self.claim_env.get("CORRAL_GANG_ID"):
            return has_checkpoint
        workspace.gang_checkpoint_dir.mkdir(exist_ok=True)
        ranks = [(rank.gang_index, rank.job_id) for rank in self.claim.gang_checkpoints]
        own = (self.job_id, workspace.checkpoint_in) if has_checkpoint else None
        checkpoints.download_gang(self._client, ranks, workspace.gang_checkpoint_dir, own, self.fields)
        return has_checkpoint

    def _wind_down(self, process: JobProcess) -> tuple[str, int | None]:
        """After the main process exited: end its leftovers, wait for the stop, and upload the
        checkpoint the job wrote, however the attempt ended (unless the job was lost). The tail,
        and the epoch to ack (None: no ack, the report is done, fail or a watchdog trip)."""
        tail = process.finish()
        if self._shipper is not None:
            with self._lock:
                lost = self._reason == StopReason.LOST
            # The whole output, before the report ends the attempt (nothing more for a lost job).
            if lost:
                self._shipper.abandon()
            else:
                self._shipper.close()
        with self._lock:
            stopper = self._stopper
        if stopper is not None:
            stopper.join()
        if process.survived_kill and self.gpu_indices and self._on_gpus_unhealthy is not None:
            self._on_gpus_unhealthy(self)
        with self._lock:
            reason, epoch = self._reason, self._epoch
        if reason == StopReason.LOST:
            return tail, None
        # A stop the server asked for that really stopped the job is acked with its epoch; a job
        # that had ended on its own first reports its own outcome, like any other end.
        ack = epoch if epoch is not None and process.stopped_while_running else None
        # Before the report: the server takes the attempt's checkpoint only until then, and the
        # report may complete the gang's drain and let the next attempt start. Bytes a checkpoint
        # phase already uploaded are not sent again; anything saved since is.
        assert self._uploads is not None
        self._uploads.upload(ack, final=True)
        return tail, ack

    def _upload_after_error(self) -> None:
        """The checkpoint of an attempt whose supervision failed, before its failure report: best
        effort, a second error here must not keep the report from going out."""
        try:
            if self._uploads is not None:
                self._uploads.upload(None, final=True)
        except Exception:
            logger.exception("checkpoint upload after a supervision error failed", extra=self.fields)

    def _supervise(self, process: JobProcess) -> int:
        """Wait for the process, ticking its walltime limit and its watchdogs when they are due;
        its exit code.

        Nothing else is done on this thread meanwhile (the heartbeats are elsewhere), so a
        watchdog or the limit is never late because the server is slow."""
        pause = MIN_WAIT_S
        limit = self._limit
        while True:
            watch = self._watch if self._watching else None
            if watch is not None and watch.stopped:
                watch, self._watching = None, False
            due = min(
                watch.next_due() if watch is not None else math.inf,
                limit.next_due() if limit is not None else math.inf,
            )
            wait_s = max(pause, min(SUPERVISE_SLICE_S, due - time.monotonic()))
            fence_wait_s = self._fence_wait_s()
            if fence_wait_s is not None:
                wait_s = max(MIN_WAIT_S, min(wait_s, fence_wait_s))
            exit_code = process.wait(wait_s)
            if exit_code is not None:
                return exit_code
            if limit is not None:
                self._tick_limit(limit, process)
            if fence_wait_s is not None:
                self._check_fence()
            if watch is None:
                continue
            pause = MIN_WAIT_S
            try:
                verdict = watch.tick(time.monotonic())
            except Exception:
                logger.exception("watchdog tick failed", extra=self.fields)
                pause = ERROR_PAUSE_S
                continue
            if verdict is not None:
                self._watching = False
                if not watch.stopped:
                    self._watchdog_tripped(verdict)

    def _tick_limit(self, limit: WalltimeLimit, process: JobProcess) -> None:
        """The walltime's step due now, if any: the warning's checkpoint phase, or the stop."""
        step = limit.tick(time.monotonic())
        if step == Step.WARN:
            self._walltime_warning(process, limit)
        elif step == Step.STOP:
            with self._lock:
                first = self._reason is None
            if first:
                logger.warning(
                    "walltime reached; stopping the job",
                    extra={**self.fields, "walltime_s": limit.walltime_s},
                )
            self.request_stop(StopReason.WALLTIME)

    def _walltime_warning(self, process: JobProcess, limit: WalltimeLimit) -> None:
        """The checkpoint hint before the limit (a phase with no epoch: hint, save, upload); not
        while the job is being stopped (the stop's end uploads anyway)."""
        with self._lock:
            uploads, workspace = self._uploads, self._workspace
            if self._reason is not None or uploads is None or workspace is None:
                return
            phase = CheckpointPhase(
                None,
                max(0.0, limit.deadline - time.monotonic()),
                process,
                uploads,
                workspace.checkpoint_done_file,
                workspace.defer_file,
                self.fields,
            )
            self._walltime_phase = phase
        logger.info(
            "walltime warning: asking the job for a checkpoint",
            extra={**self.fields, "walltime_s": limit.walltime_s, "warning_s": limit.warning_s},
        )
        phase.start()

    # --- heartbeats ------------------------------------------------------------------------

    def _beat_alone(self) -> None:
        """An attempt not kept by an agent: its own job heartbeat every ``heartbeat_s``."""
        while not self.finished.wait(self._settings.heartbeat_s):
            try:
                self.heartbeat()
            except Exception:
                # A heartbeat must never end a healthy job.
                logger.exception("job heartbeat error", extra=self.fields)

    def heartbeat(self, request: BeatRequest | None = None) -> None:
        """One job heartbeat (``POST /jobs/{id}/heartbeat``) saying ``request`` (by default what
        ``beat_request`` says now), its answer obeyed."""
        request = request or self.beat_request()
        if request is None:
            return
        try:
            answer = self._client.job_heartbeat(
                self.job_id, self._worker_id, self.attempt, request.body, busy_retry_s=HEARTBEAT_BUSY_RETRY_S
            )
        except ServerUnreachable as error:
            self.beat_unreachable(error)
        except ApiError as error:
            self.beat_refused(request, error)
        else:
            self.beat_answered(request, answer)

    def beat_request(self) -> BeatRequest | None:
        """What this attempt's next heartbeat says; None when it wants none (lost, or its report
        went out: the lease ends with the report)."""
        with self._lock:
            if self._reason == StopReason.LOST or self._reported or self.finished.is_set():
                return None
            phase = self._phase
        body = self._heartbeat_body()
        deferral = self._pending_deferral(phase)
        if deferral is not None:
            body["defer_s"] = deferral.seconds
        try:
            # The worker heartbeat carries every attempt's body: one that cannot be encoded would
            # cost every job on the worker its lease. The readings are validated where they are
            # taken; this is the last guard, and costs one small encode per attempt and beat.
            orjson.dumps(body)
        except (TypeError, orjson.JSONEncodeError):
            logger.error("the job's heartbeat body cannot be encoded; sent bare", extra=self.fields)
            return BeatRequest({})
        return BeatRequest(body, phase, deferral)

    def beat_unreachable(self, error: Exception) -> None:
        """The request may not have reached the server: a deferral goes again with the next beat."""
        logger.warning("job heartbeat failed: server unreachable", extra={**self.fields, "error": str(error)})

    def beat_refused(self, request: BeatRequest, error: ApiError) -> None:
        """The server refused this attempt's heartbeat: 404 or 409 means the job is no longer ours."""
        self._deferral_delivered(request)  # the server answered: it had the request
        if heard_through_a_stall(error.status, error.code):
            self.heard_in_a_stall(request)
        if error.status not in (404, 409):
            logger.warning(
                "job heartbeat failed", extra={**self.fields, "code": error.code, "error": str(error)}
            )
            return
        with self._lock:
            reported = self._reported
        if reported:
            # The beat crossed the attempt's own report: nothing is lost, the attempt just ended.
            return
        logger.warning(
            "job is no longer ours; stopping it without a report",
            extra={**self.fields, "code": error.code, "error": error.message},
        )
        self.request_stop(StopReason.LOST)

    def heard_in_a_stall(self, request: BeatRequest) -> None:
        """The server heard this heartbeat but its store could not write it: no lease ends while
        the store fails (``fence.heard_through_a_stall``), so the fence counts it as a renewal."""
        if self.fence is not None:
            self.fence.renewed(request.sent_at)

    def beat_answered(self, request: BeatRequest, answer: HeartbeatAnswer) -> None:
        """The server took the heartbeat: the lease is renewed as of its sending."""
        if self.fence is not None:
            self.fence.renewed(request.sent_at)
        self._deferral_delivered(request)
        with self._lock:
            reported = self._reported
        if not reported:
            self._obey(answer)

    def _deferral_delivered(self, request: BeatRequest) -> None:
        if request.phase is not None and request.deferral is not None:
            request.phase.deferral_sent(request.deferral)

    def _pending_deferral(self, phase: CheckpointPhase | None) -> Deferral | None:
        if phase is None:
            return None
        try:
            return phase.pending_deferral()
        except Exception:
            logger.exception("reading the job's deferral request failed", extra=self.fields)
            return None

    def _heartbeat_body(self) -> dict[str, Any]:
        """What the heartbeat tells besides "alive": the last step the job beat, its GPUs'
        utilisation and its process tree's memory (shown by ``corral show``), and when the job last
        saved a checkpoint (the preemption planner counts the work lost since). A reading that
        fails is left out: it must never cost the job its lease."""
        body: dict[str, Any] = {}
        watch, probe, workspace = self._watch, self._probe, self._workspace
        checkpoint_at = _saved_at(workspace.checkpoint_out) if workspace is not None else None
        if checkpoint_at is not None:
            body["checkpoint_at"] = checkpoint_at
        try:
            step = watch.beat_file.progress_step() if watch is not None else None
            if step is not None:
                body["progress"] = {"step": step}
            reading = probe.read() if probe is not None else None
        except Exception:
            logger.debug("job reading for the heartbeat failed", extra=self.fields, exc_info=True)
            return body
        if reading is not None and reading.gpu_util_pct is not None:
            body["gpu_util_pct"] = round(min(100.0, max(0.0, reading.gpu_util_pct)), 1)
        if reading is not None and reading.memory_mb is not None:
            body["rss_mb"] = round(max(0.0, reading.memory_mb), 1)
        return body

    def _obey(self, answer: HeartbeatAnswer) -> None:
        """Do what the heartbeat answer asks (the SDK has already checked it against the contract)."""
        if answer.action is None:
            # Running again: a preemption that was called off ends its checkpoint phase.
            self._end_phase("the server no longer asks for a checkpoint")
            return
        epoch = answer.preemption_epoch
        fields = {**self.fields, "preemption_epoch": epoch}
        if epoch is None:
            logger.warning(
                "heartbeat action without an epoch ignored", extra={**fields, "action": answer.action}
            )
        elif answer.action == "preempt":
            with self._lock:
                first = self._reason is None
            if first:
                logger.info("server asked to stop the job", extra=fields)
            self.request_stop(StopReason.PREEMPT, epoch)
        else:
            self._checkpoint(epoch, answer.deadline_s)

    def _checkpoint(self, epoch: int, deadline_s: float | None) -> None:
        """A ``checkpoint`` answer: the first for ``epoch`` starts its phase, later ones only move
        the deadline. Ignored while the job is being stopped (the stop's end uploads anyway), and
        before its process exists (the next answer asks again)."""
        with self._lock:
            process, uploads, workspace = self._process, self._uploads, self._workspace
            if self._reason is not None or process is None or uploads is None or workspace is None:
                return
            current = self._phase
            if current is not None and current.epoch == epoch:
                current.renew(deadline_s)
                return
            if epoch in self._checkpoint_epochs_seen:
                return  # an older epoch's late answer
            self._checkpoint_epochs_seen.add(epoch)
            phase = CheckpointPhase(
                epoch,
                deadline_s,
                process,
                uploads,
                workspace.checkpoint_done_file,
                workspace.defer_file,
                self.fields,
            )
            self._phase = phase
        if current is not None:
            current.end(f"superseded by epoch {epoch}")
        phase.start()

    def _end_phase(self, why: str) -> None:
        with self._lock:
            phases = (self._phase, self._walltime_phase)
        for phase in phases:
            if phase is not None:
                phase.end(why)

    # --- the report ------------------------------------------------------------------------

    def _report(self, process: JobProcess, exit_code: int, tail: str, epoch: int | None) -> None:
        """The one report of the attempt, made after its checkpoint was uploaded; ``epoch``: the
        stop the server asked for, to ack."""
        with self._lock:
            reason = self._reason
        fields = {**self.fields, "exit_code": exit_code}
        if reason == StopReason.LOST:
            logger.info("job stopped after it was lost; nothing reported", extra=fields)
            return
        with self._lock:
            self._reported = True
        stopped = process.stopped_while_running
        if epoch is not None:
            logger.info("job stopped; acknowledging", extra={**fields, "preemption_epoch": epoch})
            deliver_outcome(
                lambda: self._client.preempted(self.job_id, self._worker_id, self.attempt, epoch),
                "preempted ack",
                {**fields, "preemption_epoch": epoch},
            )
            return
        if reason == StopReason.WALLTIME and stopped:
            # The job's own limit: not retried (API.md "Time limits"), whatever the exit.
            assert self._limit is not None  # only the limit stops for this reason
            walltime = self._limit.walltime_s
            error = f"walltime exceeded: stopped at its limit of {walltime:g} s ({describe_exit(exit_code)})"
            self._report_failure(exit_code, error, tail, reason="walltime_exceeded")
            return
        if reason == StopReason.WATCHDOG and stopped and self.verdict is not None:
            self._report_trip(self.verdict, exit_code)
            return
        if reason == StopReason.SHUTDOWN and stopped:
            # The worker's doing, not the job's: hand it back without spending its attempt.
            self._report_failure(exit_code, SHUTDOWN_ERROR, tail, release=True)
            return
        if reason == StopReason.FENCED and stopped:
            # Neither is the fence: handed back, once the server answers again (a stale attempt's
            # report is refused, 409, and dropped: the job was re-queued meanwhile).
            self._report_failure(exit_code, FENCED_ERROR, tail, release=True)
            return
        if exit_code != 0 and self._cgroup is not None and self._cgroup.oom_killed():
            limits = self._cgroup.limits
            limit_mb = limits.memory_bytes // (1024 * 1024) if limits and limits.memory_bytes else None
            error = f"out of memory at its limit ({limit_mb} MB): {describe_exit(exit_code)} by the kernel"
            self._report_failure(exit_code, error, tail, reason="oom_killed")
            return
        if exit_code == 0:
            logger.info("job exited 0; reporting done", extra=fields)
            deliver_outcome(self._send_done, "done report", fields)
            return
        self._report_failure(exit_code, describe_exit(exit_code), tail)

    def _report_trip(self, verdict: Verdict, exit_code: int) -> None:
        fields = {**self.fields, "exit_code": exit_code, "watchdog": verdict.kind}
        answer = deliver_outcome(
            lambda: self._client.watchdog(
                self.job_id, self._worker_id, self.attempt, verdict.kind, verdict.detail
            ),
            "watchdog report",
            fields,
        )
        if answer is not None:
            logger.info(
                "watchdog trip reported",
                extra={**fields, "status": answer.status, "watchdog_retries": answer.watchdog_retries},
            )

    def _report_failure(
        self, exit_code: int | None, error: str, tail: str, release: bool = False, reason: str | None = None
    ) -> None:
        """``reason``: a failure code of API.md (``no_such_account``, ``workdir_unavailable``,
        ``oom_killed``, ``walltime_exceeded``), sent only when there is one (a server without the
        field refuses it)."""
        with self._lock:
            self._reported = True
        fields = {**self.fields, "exit_code": exit_code, "error": error, "release": release, "reason": reason}
        logger.info("job failed; reporting", extra=fields)
        options: dict[str, Any] = {"release": True} if release else {}
        if reason is not None:
            options["reason"] = reason

        def send() -> None:
            def single() -> None:
                self._client.fail(
                    self.job_id, self._worker_id, self.attempt, exit_code, error, tail, **options
                )

            if self._final_reports is None:
                single()
                return
            body = {"exit_code": exit_code, "error": error, "output_tail": tail, **options}
            self._final_reports.fail(self._client, self.job_id, self.attempt, body, single)

        deliver_outcome(send, "fail report", fields)

    def _send_done(self) -> None:
        """One try of the done report: in the worker's batch, or by its own route."""

        def single() -> None:
            self._client.report_done(self.job_id, self._worker_id, self.attempt)

        if self._final_reports is None:
            single()
        else:
            self._final_reports.done(self._client, self.job_id, self.attempt, single)
