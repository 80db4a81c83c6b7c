"""Could any registered worker ever hold this work? The one answer every reader of a waiting job's
reason shares (issue 23: the jobs list must not say "waiting for a worker with free capacity" while
``corral why`` says ``unschedulable``).

A job or gang that no usable worker could hold even if every worker were idle (64 GPUs on 8-GPU
hosts, a 5 x 4 gang on 3 x 4 GPUs, a GPU model no host has) carries reason ``unschedulable`` from
its submit on (``lifecycle.submitted``). With no usable worker at all (a cluster starting up)
nothing is said against the work: it stays ``queued`` (``why`` says ``no_workers``). Workers come
and go after the submit, so a single job's stored reason is read through ``standing_reason``
(the API, the dashboard and ``why`` alike); a gang's is kept by the admission cycle, which words it
with the same ``admission_reasons.unschedulable``.

Pure: values in, a reason out; no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from corral.core.admission_reasons import NO_WORKERS, describe, unschedulable
from corral.core.placement import Placement, free_capacity, matches_constraints, place, usable
from corral.domain.records import Constraints, Job, Reason, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status

QUEUED = Reason("queued", "waiting for a worker with free capacity")
#: the reasons that only say where a waiting single job stands against the workers: the ones a
#: change of workers may turn into one another (a planner's or a dependency's reason stays)
STANDING_CODES = frozenset({"queued", "unschedulable"})


def tasks_on(free: Resources, request: Resources) -> int:
    """How many tasks of ``request`` fit in ``free`` (one when the request is empty: spread)."""
    if request.gpus > 0 and request.vram_mb > free.vram_mb:
        return 0
    pairs = ((free.gpus, request.gpus), (free.cpus, request.cpus), (free.memory_mb, request.memory_mb))
    counts = [max(0, have) // want for have, want in pairs if want > 0]
    return min(counts) if counts else 1


def single_unschedulable(request: Resources, constraints: Constraints, largest_gpus: int) -> Reason:
    """A single job no usable worker can run even when idle."""
    return Reason(
        "unschedulable",
        f"no active worker can ever run this job (it needs {describe(request, constraints)}; "
        f"the largest worker has {largest_gpus} GPU(s))",
    )


def never_fits(
    size: int, request: Resources, constraints: Constraints, workers: Sequence[Worker]
) -> Reason | None:
    """``no_workers`` or ``unschedulable`` when ``size`` tasks of ``request`` (a single job: 1)
    could never be held at once by the usable ``workers``, even idle; None when they could.

    A single job is placed as a claim places it (``placement.place`` on an idle worker); a gang
    is counted as the admission cycle counts it (tasks per idle worker, summed). Workers alike
    (the same resources, GPU model, labels and unhealthy GPUs) are asked once: a thousand
    identical hosts cost one placement."""
    usable_workers = sorted((worker for worker in workers if usable(worker)), key=lambda worker: worker.id)
    if not usable_workers:
        return NO_WORKERS
    shapes: dict[tuple[object, ...], tuple[Worker, int]] = {}
    for worker in usable_workers:
        key = (
            worker.resources,
            worker.gpu_model,
            tuple(sorted(worker.labels.items())),
            worker.unhealthy_gpus,
        )
        first, count = shapes.get(key, (worker, 0))
        shapes[key] = (first, count + 1)
    if size <= 1:
        for worker, _ in shapes.values():
            if isinstance(place(request, constraints, worker, free_capacity(worker, ())), Placement):
                return None
        largest = max(worker.resources.gpus for worker in usable_workers)
        return single_unschedulable(request, constraints, largest)
    ever = sum(
        count * tasks_on(free_capacity(worker, ()).free, request)
        for worker, count in shapes.values()
        if matches_constraints(worker, constraints) is None
    )
    if ever >= size:
        return None
    return unschedulable(size, request, constraints, ever, usable_workers)


class Verdicts:
    """What ``workers`` make of waiting work, asked once per shape of request (a page of 500
    alike jobs, or a batch of 10,000, asks once)."""

    def __init__(self, workers: Sequence[Worker]) -> None:
        self._workers = workers
        self._known: dict[tuple[object, ...], Reason | None] = {}

    def verdict(self, size: int, request: Resources, constraints: Constraints) -> Reason | None:
        """``never_fits`` when it says ``unschedulable``: what a submit and a list say against
        work (no usable worker at all is no verdict: the first workers may still be starting)."""
        key = (size, request, constraints.gpu_model, tuple(sorted(constraints.labels.items())))
        if key not in self._known:
            never = never_fits(size, request, constraints, self._workers)
            self._known[key] = never if never is not None and never.code == "unschedulable" else None
        return self._known[key]

    def standing_reason(self, job: Job) -> Reason | None:
        """The reason ``job`` shows now: for a pending single job whose reason only says where it
        stands against the workers (``STANDING_CODES``), that standing as the workers make it
        now; otherwise the job's own reason."""
        if not needs_workers(job):
            return job.reason
        never = self.verdict(1, job.spec.resources, job.spec.constraints)
        if never is not None:
            return never
        return QUEUED if job.reason is None or job.reason.code != "queued" else job.reason

    def with_standing_reason(self, job: Job) -> Job:
        """``job`` with ``standing_reason`` in place of its stored reason (the same job when equal)."""
        reason = self.standing_reason(job)
        return job if reason == job.reason else replace(job, reason=reason)


def needs_workers(job: Job) -> bool:
    """Whether ``Verdicts.standing_reason`` reads the workers for ``job`` (else it is its own)."""
    return (
        job.status == Status.PENDING
        and job.gang_id is None
        and not job.awaiting_dependencies
        and job.reason is not None
        and job.reason.code in STANDING_CODES
    )


__all__ = [
    "QUEUED",
    "STANDING_CODES",
    "Verdicts",
    "needs_workers",
    "never_fits",
    "single_unschedulable",
    "tasks_on",
]
