"""The agent keeps its attempts' leases in the worker heartbeat and claims several jobs at once,
and falls back to a job heartbeat per attempt and to one claim at a time for a server that does
not know the batched forms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from corral.client import ApiError
from corral.protocol.answers import ClaimAnswer
from corral.testing.fake_client import FakeClient, claim_answer
from corral.worker import agent as agent_module
from corral.worker.agent import Agent
from corral.worker.calls import Claimed
from corral.worker.job_run import JobRun
from corral.worker.resources import Offer
from tests.unit.worker_support import finish, make_agent, wait_for, wait_for_file


def started_agent(client: FakeClient, cpus: int = 1) -> Agent:
    """An agent on ``client`` whose heartbeat thread runs (fast), registered, claiming nothing."""
    agent = make_agent(client, heartbeat_s=0.05, worker_heartbeat_s=0.2, preempt_grace_s=0.5)
    agent.offer = Offer(cpus, 1024, 0, 0, None)
    agent._registered = True
    agent._heartbeat_thread.start()
    return agent


def stop(agent: Agent) -> None:
    agent._heartbeat_stop.set()
    agent._heartbeat_wake.set()
    agent._heartbeat_thread.join(5)


def run_job(agent: Agent, command: str, job_id: str = "j-1", attempt: int = 1) -> JobRun:
    agent._start_job(claim_answer(job_id, attempt, command))
    return agent._snapshot()[-1]


def lease_bodies(client: FakeClient) -> list[dict[str, Any]]:
    with client.lock:
        return [call[2] for call in client.calls if call[0] == "worker_heartbeat" and "jobs" in call[2]]


def job_beats(client: FakeClient) -> int:
    with client.lock:
        return sum(1 for call in client.calls if call[0] == "job_heartbeat")


def answering(answer_of: Any) -> Any:
    """A batched heartbeat answer: ``answer_of(job_id)`` for each job of the body."""
    return lambda body: {"jobs": {job["id"]: answer_of(job["id"]) for job in body.get("jobs", [])}}


# --- batched heartbeats ----------------------------------------------------------------------


def test_leases_go_in_the_worker_heartbeat_and_no_job_heartbeat_is_sent(tmp_path: Path):
    client = FakeClient()
    client.worker_beat_answer = answering(lambda job_id: {})
    agent = started_agent(client)
    try:
        run = run_job(agent, f"touch {tmp_path}/up; sleep 0.4")
        wait_for_file(tmp_path / "up")
        finish(run)
    finally:
        stop(agent)
    bodies = lease_bodies(client)
    assert bodies, client.calls
    assert bodies[0]["jobs"][0]["id"] == "j-1" and bodies[0]["jobs"][0]["attempt"] == 1
    assert bodies[0]["running"] == ["j-1"]
    assert job_beats(client) == 0
    assert agent.batched_beats is True
    assert client.names()[-1] == "done"


def test_a_preempt_answer_in_the_batch_stops_the_job_and_acks_its_epoch(tmp_path: Path):
    client = FakeClient()
    client.worker_beat_answer = answering(lambda job_id: {"action": "preempt", "preemption_epoch": 7})
    agent = started_agent(client)
    try:
        run = run_job(agent, f"touch {tmp_path}/up; sleep 30")
        finish(run)
    finally:
        stop(agent)
    assert client.reports()[-1] == ("preempted", "j-1", "w1", 1, 7)
    assert job_beats(client) == 0


def test_a_checkpoint_answer_in_the_batch_hints_the_job(tmp_path: Path):
    client = FakeClient()
    client.worker_beat_answer = answering(
        lambda job_id: {"action": "checkpoint", "preemption_epoch": 3, "deadline_s": 30}
    )
    agent = started_agent(client)
    saved = tmp_path / "saved"
    command = f"trap 'touch {saved}; exit 0' USR1; touch {tmp_path}/up; while :; do sleep 0.05; done"
    try:
        run = run_job(agent, command)
        wait_for_file(saved)
        finish(run)
    finally:
        stop(agent)
    # the job's own calls end with its report (the agent's worker heartbeats go on beside it)
    assert [name for name in client.names() if name != "worker_heartbeat"][-1] == "done"


@pytest.mark.parametrize("code", ["stale_attempt", "not_running", "not_found"])
def test_a_refusal_in_the_batch_stops_the_job_without_a_report(tmp_path: Path, code: str):
    client = FakeClient()
    client.worker_beat_answer = answering(lambda job_id: {"error": {"code": code, "message": "not yours"}})
    agent = started_agent(client)
    try:
        run = run_job(agent, f'echo saved > "$CORRAL_CHECKPOINT_OUT"; touch {tmp_path}/up; sleep 30')
        finish(run)
    finally:
        stop(agent)
    assert client.names() == ["worker_heartbeat"] * len(client.names())  # no upload, no report
    assert job_beats(client) == 0


def test_two_attempts_of_one_job_are_not_batched_together(tmp_path: Path):
    client = FakeClient()
    client.worker_beat_answer = answering(lambda job_id: {})
    agent = started_agent(client, cpus=2)
    try:
        older = run_job(agent, f"touch {tmp_path}/a; sleep 0.5", attempt=1)
        newer = run_job(agent, f"touch {tmp_path}/b; sleep 0.5", attempt=2)
        wait_for(lambda: job_beats(client) > 0, "a job heartbeat for the older attempt")
        finish(older)
        finish(newer)
    finally:
        stop(agent)
    bodies = lease_bodies(client)
    assert bodies, "the agent batched leases"
    # A batch sent before the newer attempt was up carries the older alone (its only lease then):
    # what must never happen is both attempts of the job in one batch.
    for body in bodies:
        assert len([job["attempt"] for job in body["jobs"]]) == 1, body


# --- the fallback to a job heartbeat per attempt ----------------------------------------------


def test_an_answer_without_per_job_answers_means_one_heartbeat_per_job(tmp_path: Path):
    client = FakeClient()  # worker_beat answers None: an older server that ignored ``jobs``
    agent = started_agent(client)
    try:
        run = run_job(agent, f"touch {tmp_path}/up; sleep 0.5")
        wait_for(lambda: job_beats(client) >= 3, "job heartbeats")
        finish(run)
    finally:
        stop(agent)
    assert agent.batched_beats is False
    assert len(lease_bodies(client)) == 1, "asked once, then never again"
    assert client.names()[-1] == "done"


def test_a_400_naming_jobs_means_one_heartbeat_per_job(tmp_path: Path):
    client = FakeClient()
    client.worker_beat_answer = lambda body: (
        ApiError(400, "invalid_request", "jobs: unknown field") if "jobs" in body else None
    )
    client.heartbeat_answer = {"action": "preempt", "preemption_epoch": 2}
    agent = started_agent(client)
    try:
        run = run_job(agent, f"touch {tmp_path}/up; sleep 30")
        finish(run)
    finally:
        stop(agent)
    assert agent.batched_beats is False
    assert client.reports()[-1] == ("preempted", "j-1", "w1", 1, 2)
    # The worker heartbeat itself went out again without the jobs.
    with client.lock:
        plain = [call for call in client.calls if call[0] == "worker_heartbeat" and "jobs" not in call[2]]
    assert plain


# --- claims of several jobs -------------------------------------------------------------------


class MultiClaims(FakeClient):
    """Claims as a server answers them: ``max`` understood (a list of items), refused (400), or
    ignored (one plain claim)."""

    def __init__(self, mode: str, items: list[Any]) -> None:
        super().__init__()
        self.mode = mode
        self.items = items
        self.asked: list[int] = []

    def _take(self, count: int) -> list[Any]:
        taken, self.items = self.items[:count], self.items[count:]
        return taken

    def claim_several(
        self, worker_id: str, wait_s: float, max_jobs: int, idempotency_key: str | None = None
    ) -> Claimed:
        self._record("claim_several", max_jobs)
        self.asked.append(max_jobs)
        if self.mode == "refused":
            raise ApiError(400, "invalid_request", "max: unknown query parameter")
        items: list[ClaimAnswer | ApiError] = []
        for item in self._take(max_jobs if self.mode == "understood" else 1):
            try:
                items.append(ClaimAnswer.model_validate(item))
            except ValidationError as error:
                items.append(ApiError(200, "bad_response", str(error), item))
        return Claimed(items, self.mode == "understood")

    def claim(self, worker_id: str, wait_s: float = 0.0, idempotency_key: str | None = None) -> Any:
        self._record("claim", worker_id)
        return ClaimAnswer.model_validate(self._take(1)[0])


def claim_item(job_id: str, command: str = "sleep 0.2") -> dict[str, Any]:
    return claim_answer(job_id, 1, command, resources={"cpus": 1}).model_dump(mode="json")


def claiming(client: MultiClaims, cpus: int) -> Agent:
    agent = make_agent(client)
    agent.offer = Offer(cpus, 1024, 0, 0, None)
    agent._claims = client  # type: ignore[assignment]
    agent._registered = True
    return agent


def test_several_jobs_are_claimed_at_once_up_to_the_free_capacity():
    client = MultiClaims("understood", [claim_item(f"j-{index}") for index in range(5)])
    agent = claiming(client, cpus=3)
    agent._claim_once()
    assert client.asked == [3]
    assert agent.running_job_ids() == ["j-0", "j-1", "j-2"]
    assert agent.multi_claim is True
    assert agent.claim_room() == 1  # full: the next claim asks for one
    for run in agent._snapshot():
        finish(run)


def test_a_worker_with_much_room_claims_a_batch_at_a_time():
    jobs = agent_module.CLAIM_BATCH + 3
    client = MultiClaims("understood", [claim_item(f"j-{index}") for index in range(jobs)])
    agent = claiming(client, cpus=64)
    agent._claim_once()
    agent._claim_once()
    # Room for 64: each claim asks for a batch, and the next claim takes the rest.
    assert client.asked[0] == agent_module.CLAIM_BATCH
    assert len(client.asked) == 2
    assert max(client.asked) <= agent_module.CLAIM_BATCH
    for run in agent._snapshot():
        finish(run)


def test_a_malformed_item_of_a_multi_claim_is_failed_and_the_others_run():
    bad = {"id": "j-bad", "attempt": 4, "command": "true", "gpu_indices": "0,1"}
    client = MultiClaims("understood", [claim_item("j-0"), bad, claim_item("j-2")])
    agent = claiming(client, cpus=3)
    agent._claim_once()
    assert agent.running_job_ids() == ["j-0", "j-2"]
    fails = [call for call in client.calls if call[0] == "fail"]
    assert fails and fails[0][1] == "j-bad" and fails[0][3].startswith("malformed claim")
    for run in agent._snapshot():
        finish(run)


@pytest.mark.parametrize("mode", ["refused", "ignored"])
def test_a_server_without_max_gets_one_claim_at_a_time(mode: str):
    client = MultiClaims(mode, [claim_item("j-0"), claim_item("j-1")])
    agent = claiming(client, cpus=4)
    agent._claim_once()
    assert agent.multi_claim is False
    assert agent.running_job_ids() == ["j-0"]
    agent._claim_once()  # the next claim does not ask for several again
    assert agent.running_job_ids() == ["j-0", "j-1"]
    names = [call[0] for call in client.calls if call[0].startswith("claim")]
    assert names == (["claim_several", "claim", "claim"] if mode == "refused" else ["claim_several", "claim"])
    for run in agent._snapshot():
        finish(run)


def test_one_cpu_of_room_claims_one_job():
    client = MultiClaims("understood", [claim_item("j-0")])
    agent = claiming(client, cpus=1)
    agent._claim_once()
    assert [call[0] for call in client.calls if call[0].startswith("claim")] == ["claim"]
    for run in agent._snapshot():
        finish(run)
