"""The differential test: one small workload through the real server (over HTTP, a fake clock, no
real processes) and through the simulator; every job's status changes, their times and their
workers must be the same, so the simulator cannot drift from what the server does.

The driver below plays the workers and the jobs by the simulator's own model (``SimSettings``'s
docstring): after every instant, workers claim in id order until nothing is left; the admission
loop runs at each tick; a victim heartbeats ``heartbeat_s`` after it is told to stop and every
``heartbeat_s`` after, saves on the ``checkpoint`` answer and uploads ``checkpoint_save_s`` later,
and acks ``stop_s`` after the ``preempt`` answer; a job reports done when its work is over.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from datetime import datetime

import httpx
import pytest

from corral.config import ServerSettings
from corral.sim import engine
from corral.sim.policy import CORRAL
from corral.sim.readers import pool_settings, uniform_cluster
from corral.sim.workload import Scenario, SimSettings, Workload, WorkloadJob
from corral.store import open_store
from corral.testing.clock import FakeClock
from corral.testing.server import ServerThread

BASE = 1_800_000_000.0
#: a gang's preemption exemption (off by default): both sides must keep it alike, and wake up when
#: it runs out (the simulator skips ticks that cannot act: "backfill-reservations" preempts its
#: gang at the first tick past the exemption, with nothing else happening then)
GANG_EXEMPT_S = 30.0
SETTINGS = SimSettings(
    heartbeat_s=5.0, checkpoint_save_s=12.0, stop_s=1.0, gang_preempt_exempt_s=GANG_EXEMPT_S
)

WORKLOAD = (
    WorkloadJob("a", 0, 300, 2, preemption_class=2, checkpoint="auto"),
    WorkloadJob("b", 1, 200, 1, preemption_class=3),
    WorkloadJob("c", 2, 100, 1, preemption_class=5),
    WorkloadJob("d", 3, 400, 2, preemption_class=2),
    WorkloadJob("g", 4, 100, 2, gang_size=2, preemption_class=5),
    WorkloadJob("h", 21, 150, 2, preemption_class=8),
    WorkloadJob("e", 33, 50, 1, preemption_class=5, checkpoint="auto"),
    WorkloadJob("f", 34, 60, 1, preemption_class=2),
    WorkloadJob("k", 52, 80, 2, preemption_class=6, checkpoint="manual"),
)
#: pools with guarantees: pool "big" borrows "small"'s share, which "small" reclaims; work no
#: preemption could take back (class 8, no checkpoint) is refused borrowed capacity
POOLS = {"small": {"guarantee": {"gpus": 2}}, "big": {"guarantee": {"gpus": 4}}}
POOLED = (
    WorkloadJob("b1", 0, 300, 2, pool="big", preemption_class=4, checkpoint="auto"),
    WorkloadJob("b2", 1, 300, 2, pool="big", preemption_class=4),
    WorkloadJob("b3", 2, 250, 2, pool="big", preemption_class=3, checkpoint="auto"),
    WorkloadJob("s1", 20, 100, 2, pool="small", preemption_class=3),
    WorkloadJob("u1", 30, 60, 2, pool="big", preemption_class=8),
    WorkloadJob("s2", 40, 50, 1, pool="small", preemption_class=5, checkpoint="manual"),
    WorkloadJob("bg", 45, 80, 1, gang_size=2, pool="big", preemption_class=6),
)
#: two pools of equal weight: "heavy" fills every GPU, then "light" arrives, is below its fair share,
#: starves after its timer and takes heavy's newest allocations, one per worker per backoff
FAIR = (
    *(WorkloadJob(f"h{index}", index, 400, 1, pool="heavy", checkpoint="auto") for index in range(6)),
    WorkloadJob("h-gang", 8, 200, 1, gang_size=2, pool="heavy"),
    *(WorkloadJob(f"l{index}", 20 + index, 100, 1, pool="light") for index in range(4)),
)
#: every pool kind: a service pool preemptible only where it borrows, a sensitive pool never
#: preempted (its work waits rather than take another pool's guarantee for good), training and
#: interactive pools beside batch
KINDS = {
    "svc": {"kind": "service", "guarantee": {"gpus": 2}},
    "sens": {"kind": "sensitive", "guarantee": {"gpus": 2}},
    "train": {"kind": "training", "guarantee": {"gpus": 2}},
    "inter": {"kind": "interactive"},
    "batch": {"kind": "batch"},
}
POOL_KINDS = (
    WorkloadJob("v1", 0, 300, 2, pool="svc", preemption_class=4, checkpoint="auto"),
    WorkloadJob("v2", 1, 300, 2, pool="svc", preemption_class=4, checkpoint="auto"),
    WorkloadJob("t1", 2, 250, 2, pool="train", preemption_class=3, checkpoint="manual"),
    WorkloadJob("b1", 3, 200, 2, pool="batch", preemption_class=2),
    WorkloadJob("s1", 10, 120, 2, pool="sens", preemption_class=5),
    WorkloadJob("i1", 12, 60, 1, pool="inter", preemption_class=7, checkpoint="auto"),
    WorkloadJob("sg", 30, 90, 1, gang_size=2, pool="sens", preemption_class=6),
    WorkloadJob("t2", 40, 100, 2, pool="train", preemption_class=8, checkpoint="auto"),
    WorkloadJob("b2", 60, 50, 1, pool="batch", preemption_class=9),
)
#: a light pool that may starve aggressively: its timers are short, the heavy pool's work cannot
#: checkpoint, and the light pool asks for more than its share. Durations differ so that no two
#: allocations start at the same instant: the victim order breaks such ties on job ids, which the
#: server draws at random and the simulator takes from the workload
AGGRESSIVE_POOLS = {
    "heavy": {},
    "light": {
        "enable_aggressive_starvation": True,
        "allow_aggressive_preemption": True,
        "starvation_timeout_s": 10,
        "aggressive_starvation_timeout_s": 20,
    },
}
AGGRESSIVE = (
    *(WorkloadJob(f"h{index}", index, 500, 1, pool="heavy", preemption_class=4) for index in range(6)),
    WorkloadJob("hg", 6, 450, 1, gang_size=2, pool="heavy", preemption_class=4),
    *(
        WorkloadJob(f"l{index}", 20 + index, 100 + 9 * index, 1, pool="light", preemption_class=4)
        for index in range(6)
    ),
)
#: every preemption trigger in one run: priority (class 8 over class 2), fair share (a starving
#: pool), reclaim (a pool below its guarantee takes back what another borrowed); gangs as victims
#: and as preemptors, every pool kind
EVERYTHING_POOLS = {
    "prod": {"kind": "training", "guarantee": {"gpus": 4}, "weight": 2},
    "research": {"kind": "batch", "weight": 1, "starvation_timeout_s": 15},
    "svc": {"kind": "service", "guarantee": {"gpus": 2}},
    "sens": {"kind": "sensitive"},
    "lab": {"kind": "batch", "weight": 1, "starvation_timeout_s": 10},
}
EVERYTHING = (
    WorkloadJob("r1", 0, 400, 2, pool="research", preemption_class=2, checkpoint="auto"),
    WorkloadJob("r2", 1, 400, 2, pool="research", preemption_class=2),
    WorkloadJob("rg", 2, 300, 1, gang_size=2, pool="research", preemption_class=3, checkpoint="auto"),
    WorkloadJob("r3", 3, 350, 2, pool="research", preemption_class=3),
    WorkloadJob("p1", 20, 200, 2, pool="prod", preemption_class=5, checkpoint="manual"),
    WorkloadJob("pg", 25, 150, 1, gang_size=2, pool="prod", preemption_class=6),
    WorkloadJob("v1", 30, 100, 2, pool="svc", preemption_class=4),
    WorkloadJob("x1", 45, 80, 2, pool="research", preemption_class=8),
    WorkloadJob("s1", 50, 60, 1, pool="sens", preemption_class=5),
    WorkloadJob("r4", 60, 120, 1, pool="research", preemption_class=1, checkpoint="auto"),
    WorkloadJob("p2", 90, 100, 2, pool="prod", preemption_class=7, checkpoint="none"),
    WorkloadJob("l1", 330, 60, 1, pool="lab", preemption_class=2),
    WorkloadJob("l2", 331, 70, 1, pool="lab", preemption_class=2),
    WorkloadJob("l3", 332, 50, 2, pool="lab", preemption_class=2),
)
#: time limits: jobs whose work outlasts their walltime (their own, or their pool's default) are
#: ended at it and fail, others finish under it; p1 is within near_completion_s of its deadline
#: (protected), so the class-8 job takes the class-5 gang rather than the class-2 p1
WALLTIME_POOLS = {"short": {"default_walltime_s": 50}}
WALLTIME = (
    WorkloadJob("t1", 0, 200, 1, walltime=60),
    WorkloadJob("t2", 1, 100, 1, walltime=150),
    WorkloadJob("s1", 2, 120, 1, pool="short"),
    WorkloadJob("p1", 3, 400, 1, preemption_class=2, walltime=350),
    WorkloadJob("g", 5, 60, 1, gang_size=2),  # runs past its exemption: x takes it then
    WorkloadJob("p2", 56, 400, 1, preemption_class=2),
    WorkloadJob("q1", 64, 500, 1, preemption_class=3),
    WorkloadJob("x", 70, 50, 1, preemption_class=8),
)
#: pool limits: "capped" may hold 2 GPUs at once over its subtree; its children's jobs, its gang and
#: its class-8 job (which would otherwise preempt "free"'s class-2 work) wait until its own work ends,
#: while "free" uses the rest of the cluster
LIMITED_POOLS = {"capped": {"limits": {"gpus": 2}}, "capped/b": {"weight": 2}, "free": {}}
LIMITED = (
    WorkloadJob("c1", 0, 200, 1, pool="capped/a", preemption_class=2),
    WorkloadJob("c2", 1, 150, 1, pool="capped/b", preemption_class=2, checkpoint="auto"),
    WorkloadJob("c3", 2, 100, 1, pool="capped/a", preemption_class=2),
    WorkloadJob("f1", 3, 300, 2, pool="free", preemption_class=2),
    WorkloadJob("cg", 4, 90, 1, gang_size=2, pool="capped", preemption_class=5),
    WorkloadJob("f2", 5, 400, 1, pool="free", preemption_class=1, checkpoint="auto"),
    WorkloadJob("x", 10, 60, 1, pool="capped/b", preemption_class=8),
    WorkloadJob("f3", 12, 80, 1, pool="free", preemption_class=3),
    WorkloadJob("y", 20, 50, 1, pool="free", preemption_class=8),
)
#: reservations (backfill as Slurm does it): the 2x2 gang is planned at the later of the running
#: jobs' limits; a short job backfills its room beside the 1-GPU job, a 2-GPU job whose limit
#: ends before the plan backfills the first worker once it is free, the job without a walltime
#: waits for the gang, which a class-8 job preempts once it runs
BACKFILL = (
    WorkloadJob("w", 0, 30, 2, walltime=30),
    WorkloadJob("w2", 1, 100, 1, walltime=120),
    WorkloadJob("big", 2, 40, 2, gang_size=2),
    WorkloadJob("short", 5, 5, 1, walltime=10),
    WorkloadJob("endless", 6, 50, 1),
    WorkloadJob("mid", 35, 50, 2, walltime=60),
    WorkloadJob("late", 37, 20, 1, walltime=30),
    WorkloadJob("x", 110, 20, 2, preemption_class=8),
)
#: (workload, pools, workers, GPUs per worker, the victims' reason codes the run must show). No two
#: jobs of a workload are submitted or started at the same instant: the queue and victim orders
#: break such ties on job ids, which the server draws at random and the simulator does not.
CASES = {
    "classes-and-gangs": (WORKLOAD, {}, 3, 2, {"preempted_priority"}),
    "pools-reclaim-and-borrowing": (POOLED, POOLS, 3, 2, {"preempted_reclaim"}),
    "fair-share-starvation": (FAIR, {"heavy": {}, "light": {}}, 3, 2, {"preempted_fair_share"}),
    "pool-kinds": (POOL_KINDS, KINDS, 4, 2, set()),
    "walltime": (WALLTIME, WALLTIME_POOLS, 2, 2, {"preempted_priority"}),
    "backfill-reservations": (BACKFILL, {}, 2, 2, {"preempted_priority"}),
    "aggressive-starvation": (AGGRESSIVE, AGGRESSIVE_POOLS, 4, 2, {"preempted_fair_share"}),
    "pool-limits": (LIMITED, LIMITED_POOLS, 3, 2, {"preempted_priority"}),
    "every-trigger": (
        EVERYTHING,
        EVERYTHING_POOLS,
        4,
        2,
        {"preempted_priority", "preempted_fair_share", "preempted_reclaim"},
    ),
}
END, BEAT, SAVED, STOPPED, SUBMIT, TIMEOUT = range(6)


Decision = tuple[float, str, str, str, str]


def simulated(workload: tuple[WorkloadJob, ...], pools: dict, workers: int, gpus: int) -> list[Decision]:
    settings = {path: pool_settings(body) for path, body in pools.items()}
    scenario = Scenario(Workload(workload), uniform_cluster(workers, gpus), settings, SETTINGS)
    record = engine.run(scenario, CORRAL, record_decisions=True)
    return sorted(_comparable(*decision) for decision in record.decisions)


def _comparable(at: float, status: str, job: str, worker: str, reason: str) -> Decision:
    """A status change as both sides can tell it: the worker where one is assigned, the reason
    where a victim is told why it is stopped (which preemption trigger chose it)."""
    return (
        round(at, 3),
        status,
        job,
        worker if status in ("reserved", "running") else "",
        reason if status == "preempting" else "",
    )


class Driver:
    """Workers and jobs around a live server, by the simulator's model of them."""

    def __init__(
        self,
        api: httpx.Client,
        server: ServerThread,
        clock: FakeClock,
        workload: tuple[WorkloadJob, ...],
        workers: tuple[str, ...],
    ) -> None:
        self.api, self.server, self.clock = api, server, clock
        self.workers = workers
        self.workload = workload
        self.events: list[tuple[float, int, int, tuple[object, ...]]] = []
        self.seq = 0
        self.names: dict[str, str] = {}  # server job id -> workload id (".rank" for gang tasks)
        self.work = {job.job_id: job for job in workload}
        self.kept: dict[str, float] = {}
        self.phase_saved: dict[str, float] = {}
        self.uploaded: dict[str, float] = {}
        self.running: dict[str, dict] = {}  # server job id -> the claim's answer
        self.stopping: dict[str, int] = {}  # server job id -> the epoch it was told to stop at
        self.working_since: dict[str, float] = {}

    def at(self, time: float, kind: int, payload: tuple[object, ...]) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time, kind, self.seq, payload))

    @property
    def now(self) -> float:
        return self.clock.now() - BASE

    def move_to(self, time: float) -> None:
        self.clock.advance(time - self.now)

    def run(self, until: float) -> None:
        for job in self.workload:
            self.at(job.submit_time, SUBMIT, (job,))
        tick, next_tick = SETTINGS.admission_tick_s, 0.0
        while next_tick <= until:
            due = self.events[0][0] if self.events else math.inf
            if next_tick < due:
                self.move_to(next_tick)
                self.cycle()
                next_tick += tick
                continue
            self.move_to(due)
            while self.events and self.events[0][0] == due:
                _, kind, _, payload = heapq.heappop(self.events)
                self.handle(kind, payload)
            self.claims()
            if next_tick == due:
                self.cycle()
                next_tick += tick

    def cycle(self) -> None:
        self.server.run_loop("admission")
        for job_id, claimed in list(self.running.items()):
            job = self.api.get(f"/jobs/{job_id}").json()
            epoch = job["preemption_epoch"]
            if job["status"] == "preempting" and self.stopping.get(job_id) != epoch:
                self.stopping[job_id] = epoch
                self.at(self.now + SETTINGS.heartbeat_s, BEAT, (job_id, claimed["attempt"]))
        self.claims()

    def claims(self) -> None:
        for worker in self.workers:
            while True:
                answer = self.api.get("/jobs/next", params={"worker_id": worker})
                if answer.status_code == 204:
                    break
                claimed = answer.json()
                job_id = claimed["id"]
                self.running[job_id] = claimed
                deadline = self.deadline(job_id)
                if deadline is not None:  # its worker stops it there, and reports once it exited
                    self.at(deadline + SETTINGS.stop_s, TIMEOUT, (job_id, claimed["attempt"]))
                self.phase_saved.pop(job_id, None)
                self.uploaded.pop(job_id, None)
                ranks = [job_id]
                if claimed.get("gang_id"):  # a gang works once its last rank runs
                    ranks = [
                        i
                        for i in self.names
                        if self.names[i].split(".")[0] == self.names[job_id].split(".")[0]
                    ]
                    if any(self.api.get(f"/jobs/{rank}").json()["status"] != "running" for rank in ranks):
                        continue
                for rank in ranks:
                    self.working_since[rank] = self.now
                    remaining = self.work[self.names[rank].split(".")[0]].duration - self.kept.get(rank, 0.0)
                    deadline = self.deadline(rank)
                    if deadline is None or self.now + remaining <= deadline:
                        self.at(self.now + remaining, END, (rank, self.running[rank]["attempt"]))

    def deadline(self, job_id: str) -> float | None:
        """The claim's ``deadline_at`` (its start plus its walltime_s), as the driver's time."""
        stamp = self.running[job_id]["deadline_at"]
        return None if stamp is None else round(_seconds(stamp), 3)

    def fenced(self, job_id: str, attempt: int, **extra: object) -> dict:
        return {"worker_id": self.running[job_id]["worker_id"], "attempt": attempt, **extra}

    def handle(self, kind: int, payload: tuple[object, ...]) -> None:
        if kind == SUBMIT:
            (work,) = payload
            assert isinstance(work, WorkloadJob)
            body = {
                "command": "true",
                "name": work.job_id,
                "gang_size": work.gang_size,
                "resources": {"gpus": work.gpus},
                "preemption_class": work.preemption_class,
                "checkpoint": work.checkpoint,
                "pool": work.pool,
            }
            if work.walltime is not None:
                body["walltime_s"] = work.walltime
            created = self.api.post("/jobs", json=body)
            assert created.status_code == 201, created.text
            answer = created.json()
            if work.gang_size > 1:  # the answer lists the tasks' ids in rank order
                for rank, task_id in enumerate(answer["tasks"]):
                    self.names[task_id] = f"{work.job_id}.{rank}"
            else:
                self.names[answer["id"]] = work.job_id
            return
        job_id, attempt = payload[0], payload[1]
        assert isinstance(job_id, str) and isinstance(attempt, int)
        if self.running.get(job_id, {}).get("attempt") != attempt:
            return
        if kind == END:
            self.api.post(f"/jobs/{job_id}/done", params=self.fenced(job_id, attempt))
        elif kind == TIMEOUT:
            if self.api.get(f"/jobs/{job_id}").json()["status"] == "running":  # else its stop is acked
                body = {"error": "walltime exceeded", "reason": "walltime_exceeded"}
                self.api.post(f"/jobs/{job_id}/fail", params=self.fenced(job_id, attempt), json=body)
                self.working_since.pop(job_id, None)
        elif kind == BEAT:
            answer = self.api.post(f"/jobs/{job_id}/heartbeat", params=self.fenced(job_id, attempt))
            if answer.status_code != 200:
                return
            action = answer.json().get("action")
            epoch = answer.json().get("preemption_epoch")
            if action == "checkpoint":
                if job_id not in self.phase_saved:
                    self.phase_saved[job_id] = self.progress(job_id)
                    self.at(self.now + SETTINGS.checkpoint_save_s, SAVED, (job_id, attempt, epoch))
                self.at(self.now + SETTINGS.heartbeat_s, BEAT, (job_id, attempt))
            elif action == "preempt":
                self.at(self.now + SETTINGS.stop_s, STOPPED, (job_id, attempt, epoch))
        elif kind == SAVED:
            params = self.fenced(job_id, attempt, epoch=payload[2])
            if (
                self.api.post(f"/jobs/{job_id}/checkpoint", params=params, content=b"saved").status_code
                == 200
            ):
                self.uploaded[job_id] = self.phase_saved[job_id]
        elif kind == STOPPED:
            progress = self.progress(job_id)
            params = self.fenced(job_id, attempt, epoch=payload[2])
            if self.api.post(f"/jobs/{job_id}/preempted", params=params).status_code == 200:
                self.kept[job_id] = self.uploaded.get(job_id, self.kept.get(job_id, 0.0))
                self.working_since.pop(job_id, None)
                assert progress >= self.kept[job_id]

    def progress(self, job_id: str) -> float:
        since = self.working_since.get(job_id, self.now)
        return self.kept.get(job_id, 0.0) + self.now - since

    def decisions(self) -> list[Decision]:
        found = []
        for job_id, name in self.names.items():
            events = self.api.get(f"/jobs/{job_id}/events").json()["items"]
            found.extend(
                _comparable(
                    _seconds(event["at"]),
                    event["to"],
                    name,
                    event.get("worker_id") or "",
                    (event.get("reason") or {}).get("code", ""),
                )
                for event in events
            )
        return sorted(found)


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - BASE


@pytest.fixture
def live(tmp_path) -> Iterator[tuple[httpx.Client, ServerThread, FakeClock]]:
    clock = FakeClock(BASE)
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}")
    settings = ServerSettings(
        heartbeat_timeout_s=3600,
        worker_offline_s=3600,
        dead_worker_after_s=3600,
        gang_preempt_exempt_s=GANG_EXEMPT_S,
    )
    with ServerThread(store, settings, clock) as server, httpx.Client(base_url=server.url, timeout=10) as api:
        yield api, server, clock
    store.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_server_and_the_simulator_decide_the_same(live, case) -> None:
    api, server, clock = live
    workload, pools, workers, gpus, triggers = CASES[case]
    names = tuple(worker.id for worker in uniform_cluster(workers, gpus).workers)
    for worker in names:
        body = {"id": worker, "address": "127.0.0.1", "resources": {"gpus": gpus}}
        assert api.post("/workers/register", json=body).status_code == 201
    for path, body in pools.items():
        assert api.put(f"/pools/{path}", json=body).status_code in (200, 201)
    expected = simulated(workload, pools, workers, gpus)
    driver = Driver(api, server, clock, workload, names)
    driver.run(until=max(at for at, *_ in expected) + SETTINGS.admission_tick_s)
    got = driver.decisions()
    assert got == expected
    statuses = {status for _, status, *_ in expected}
    assert {"preempting", "preempted", "reserved", "blocked", "done"} <= statuses, "the workload covers them"
    limited = {
        job.job_id for job in workload if (job.walltime or pools.get(job.pool, {}).get("default_walltime_s"))
    }
    ended = {job.split(".")[0] for _, status, job, *_ in expected if status in ("done", "failed")}
    assert {job.job_id for job in workload} <= ended
    failed = {job for _, status, job, *_ in expected if status == "failed"}
    assert failed <= limited, "only a job past its walltime fails"
    reasons = {reason for *_, reason in expected if reason}
    assert triggers <= reasons, f"the workload preempts for {sorted(triggers)}; it showed {sorted(reasons)}"


def test_the_limited_pool_of_the_pool_limits_case_never_holds_more_than_its_limit() -> None:
    """The case above agrees with the server; this says what both do: "capped" holds at most 2
    GPUs at any instant, its class-8 job preempts nobody, and "free"'s class-8 job does."""
    holding: set[str] = set()
    most = 0
    for _, status, job_id, _, reason in simulated(LIMITED, LIMITED_POOLS, 3, 2):
        if job_id.startswith(("c", "x")):
            if status in ("reserved", "running", "preempting"):
                holding.add(job_id)
            else:
                holding.discard(job_id)
            most = max(most, len(holding))
        if status == "preempting":
            assert reason == "preempted_priority"
    assert most == 2
    decisions = simulated(LIMITED, LIMITED_POOLS, 3, 2)
    assert [job_id for _, status, job_id, _, _ in decisions if status == "preempting"] == ["f2"]
    assert next(at for at, status, job_id, _, _ in decisions if status == "running" and job_id == "x") > 150
