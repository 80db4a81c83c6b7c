"""The agent around the attempts: claims during shutdown handed back, unhealthy GPUs said before
the report frees them, a 404 on claim that waits instead of spinning, malformed claims failed (or
ignored when they cannot be reported)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import ValidationError

from corral.client import ApiError, ServerUnreachable
from corral.protocol.answers import ClaimAnswer
from corral.testing.fake_client import FakeClient, claim_answer
from corral.worker.agent import Agent
from tests.unit.worker_support import make_agent, make_run


def test_a_job_claimed_during_shutdown_is_released():
    client = FakeClient()
    agent = make_agent(client)
    agent._accepting = False
    agent._start_job(claim_answer(attempt=2))
    assert client.calls == [("fail", "j-1", None, "worker shut down", "", ("release", True))]


# --- unhealthy GPUs are said before the report -----------------------------------------------


def test_unhealthy_gpus_are_heartbeated_at_once():
    client = FakeClient()
    agent = make_agent(client)
    agent._registered = True
    run = make_run(client, "true")
    run.gpu_indices = [1]
    agent._gpus_unhealthy(run)  # the heartbeat thread is not even started
    assert client.calls == [("worker_heartbeat", "w1", {"running": [], "unhealthy_gpus": [1]})]


# --- a 404 on claim does not spin ------------------------------------------------------------


class NotFoundClaims:
    def __init__(self) -> None:
        self.claims = 0

    def claim(self, worker_id: str, wait_s: float = 0.0, idempotency_key: str | None = None) -> Any:
        self.claims += 1
        raise ApiError(404, "not_found", "unknown worker")


class WaitsRecorded(threading.Event):
    """A stop event that records how long it was asked to wait and returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def test_a_404_on_claim_waits_before_registering_again():
    agent = make_agent(FakeClient(), poll_s=0.3)
    claims = NotFoundClaims()
    agent._claims = claims  # type: ignore[assignment]
    agent._registered = True
    agent.stopping = WaitsRecorded()
    agent._claim_once()
    assert agent.stopping.waits == [0.3], "it waited one poll_s"
    assert claims.claims == 1
    assert not agent._registered


# --- malformed claims ------------------------------------------------------------------------


class ClaimingClient(FakeClient):
    """Claims answer what the test scripts, through the real SDK's parsing: a claim that breaks the
    contract comes back as ``ApiError`` ``bad_response`` with the raw answer."""

    def __init__(self, claim: Any) -> None:
        super().__init__()
        self.claim_body = claim

    def claim(self, worker_id: str, wait_s: float = 0.0, idempotency_key: str | None = None) -> Any:
        self._record("claim", worker_id)
        try:
            return ClaimAnswer.model_validate(self.claim_body)
        except ValidationError as error:
            raise ApiError(200, "bad_response", str(error), self.claim_body) from error


def claiming_agent(claim: Any) -> tuple[Agent, ClaimingClient]:
    client = ClaimingClient(claim)
    agent = make_agent(client)
    agent._claims = client
    agent._registered = True
    return agent, client


@pytest.mark.parametrize(
    "claim",
    [
        {"id": "j-1", "attempt": 3},
        {"id": "j-1", "attempt": 3, "command": "true", "gpu_indices": ["a"]},
        {"id": "j-1", "attempt": 3, "command": "true", "gpu_indices": "0,1"},
        {"id": "j-1", "attempt": 3, "command": "true", "env": ["A=1"]},
    ],
)
def test_a_malformed_claim_is_failed_at_once(claim: dict[str, Any]):
    agent, client = claiming_agent(claim)
    agent._claim_once()
    assert client.names() == ["claim", "fail"]
    call = client.calls[-1]
    assert call[1] == "j-1" and call[2] is None and call[3].startswith("malformed claim")
    assert ("release", True) not in call
    assert agent.running_job_ids() == []


@pytest.mark.parametrize("claim", [{"id": "j-1", "attempt": "x", "command": "true"}, ["j-1"], {"attempt": 1}])
def test_a_claim_without_usable_id_and_attempt_is_not_reported(claim: Any):
    agent, client = claiming_agent(claim)
    agent._claim_once()
    assert client.names() == ["claim"]


# --- a claim that got no answer is retried with its key ---------------------------------------


class ScriptedClaims(FakeClient):
    """Each claim takes the next scripted outcome (an exception to raise, or None: no work) and
    records the Idempotency-Key it carried."""

    def __init__(self, outcomes: list[Exception | None]) -> None:
        super().__init__()
        self.outcomes = outcomes
        self.keys: list[str | None] = []

    def claim(self, worker_id: str, wait_s: float = 0.0, idempotency_key: str | None = None) -> Any:
        self.keys.append(idempotency_key)
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome
        return None


def scripted_agent(outcomes: list[Exception | None]) -> tuple[Agent, ScriptedClaims]:
    claims = ScriptedClaims(outcomes)
    agent = make_agent(FakeClient(), poll_s=0.01)
    agent._claims = claims  # type: ignore[assignment]
    agent._registered = True
    return agent, claims


def test_a_claim_without_an_answer_is_retried_with_the_same_key_and_an_answered_one_is_not():
    unreachable = ServerUnreachable("http://x", ConnectionError("reset"))
    agent, claims = scripted_agent(
        [unreachable, ApiError(503, "store_busy", "busy"), None, ApiError(400, "invalid_request", "no"), None]
    )
    for _ in range(5):
        agent._claim_once()
    first, after_503, answered, refused, fresh = claims.keys
    assert first is not None and after_503 == first and answered == first
    assert refused not in (None, first), "after an answer, the next claim has a key of its own"
    assert fresh not in (None, first, refused), "a refused claim started nothing: its key is dropped"


# --- a registration refused for good stops the worker; anything else is asked again ------------


class ScriptedRegistrations:
    """``register_worker`` raises each outcome in turn (None: registered)."""

    def __init__(self, outcomes: list[Exception | None]) -> None:
        self.outcomes = outcomes
        self.calls = 0

    def register_worker(self, body: dict[str, Any]) -> dict[str, Any]:
        outcome = self.outcomes[self.calls]
        self.calls += 1
        if outcome is not None:
            raise outcome
        return {"id": body["id"]}


@pytest.mark.parametrize(
    "transient",
    [
        ServerUnreachable("http://x", OSError("connection refused")),
        ApiError(500, "internal", "internal error"),
        ApiError(503, "store_busy", "the store is busy"),
        ApiError(409, "conflict", "worker w1 holds j-1"),
        ApiError(429, "too_many_requests", "slow down"),
    ],
)
def test_a_transient_refusal_is_asked_again(transient: Exception):
    client = ScriptedRegistrations([transient, None])
    agent = make_agent(client)
    assert agent.register() is False
    assert not agent.refused.is_set() and not agent.stopping.is_set()
    assert agent.register() is True and client.calls == 2


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "invalid_request"), (401, "unauthenticated"), (403, "forbidden"), (413, "too_large")],
)
def test_a_registration_refused_for_good_stops_the_worker_with_the_servers_message(status: int, code: str):
    client = ScriptedRegistrations([ApiError(status, code, "resources.gpus: must be at most 1000000")])
    agent = make_agent(client)
    assert agent.register() is False
    assert agent.refused.is_set() and agent.stopping.is_set()
    assert agent.refusal == f"{code}: resources.gpus: must be at most 1000000"


# --- leaving ----------------------------------------------------------------------------------


def test_a_stopping_worker_says_it_is_leaving_and_a_refusal_does_not_stop_the_shutdown():
    client = FakeClient()
    agent = make_agent(client)
    agent._leave()
    assert client.calls == [("leave_worker", "w1")]

    class Unreachable(FakeClient):
        def leave_worker(self, worker_id: str) -> None:
            raise ServerUnreachable("http://127.0.0.1:9", ConnectionRefusedError())

    agent = make_agent(Unreachable())
    agent._leave()  # logged, not raised: the offline timer takes over
