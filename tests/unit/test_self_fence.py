"""The worker's self-fence (issue 24 item 3): the decision on a fake clock, then attempts on a
scripted client whose heartbeats cannot reach the server: stopped before the lease ends and
handed back, hinted first when they checkpoint, left alone with the fence off; and the agent,
which counts a lease from the sending of the claim that was answered."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from corral.client import ApiError, ServerUnreachable
from corral.testing.clock import FakeClock
from corral.testing.fake_client import FakeClient, claim_answer
from corral.worker.fence import (
    LeaseFence,
    effective_margin_s,
    fence_after_s,
    fence_due,
    heard_through_a_stall,
)
from corral.worker.job_run import FENCED_ERROR, BeatRequest, JobRun
from tests.unit.worker_support import finish, make_agent, make_run, wait_for_file

SPIN = "while :; do sleep 0.05; done"

# --- the decision -----------------------------------------------------------------------------


def test_the_fence_is_due_the_margin_before_the_lease_ends():
    assert not fence_due(renewed_at=100.0, now=127.9, lease_s=30, margin_s=2)
    assert fence_due(renewed_at=100.0, now=128.0, lease_s=30, margin_s=2)
    assert fence_after_s(30, 2) == 28


@pytest.mark.parametrize(
    ("lease_s", "margin_s", "after_s"),
    [(30, 2, 28), (1, 2, 0.75), (6, 2, 4.5), (6, 0, 6), (4, 1, 3), (100, 40, 75)],
)
def test_the_margin_takes_at_most_a_quarter_of_the_lease(lease_s: float, margin_s: float, after_s: float):
    """A margin meant for a 30 s lease must not make a 1 s lease's fence fire at half of it."""
    assert fence_after_s(lease_s, margin_s) == pytest.approx(after_s)
    assert effective_margin_s(lease_s, margin_s) == pytest.approx(lease_s - after_s)


def test_each_renewal_moves_the_fence_and_a_late_answer_never_moves_it_back():
    clock = FakeClock(start=0.0)
    fence = LeaseFence(lease_s=8, margin_s=2, renewed_at=clock.now(), clock=clock.now)
    clock.advance(5.9)
    assert not fence.due()
    fence.renewed(sent_at=3.0)  # a heartbeat sent at 3 s, answered now
    assert fence.deadline() == pytest.approx(9.0)
    clock.advance(3.0)  # 8.9 s: 5.9 s since the renewal
    assert not fence.due()
    fence.renewed(sent_at=1.0)  # an older heartbeat's answer, late
    assert fence.renewed_at == 3.0
    clock.advance(0.1)
    assert fence.due()
    assert fence.silent_s() == pytest.approx(6.0)


def test_a_renewal_counts_from_the_heartbeats_sending_not_its_answer():
    """The server recorded the heartbeat after it was sent: counting from the sending errs on the
    side of an early stop, never a late one."""
    clock = FakeClock(start=50.0)
    fence = LeaseFence(lease_s=10, margin_s=1, renewed_at=clock.now(), clock=clock.now)
    request = BeatRequest({}, sent_at=clock.now() + 5)
    clock.advance(8.0)  # the answer took 3 s to come back
    fence.renewed(request.sent_at)
    assert fence.deadline() == pytest.approx(50.0 + 5 + 9)


# --- attempts cut off from the server ---------------------------------------------------------


def cut_off() -> FakeClient:
    client = FakeClient()
    client.heartbeat_error = ServerUnreachable("http://server", OSError("connection refused"))
    return client


def without_tails(client: FakeClient) -> list[tuple[Any, ...]]:
    """The reports, a failure's output tail left out (the shell's "Terminated" or not)."""
    return [call[:4] + call[5:] if call[0] == "fail" else call for call in client.reports()]


def test_an_attempt_that_cannot_renew_its_lease_is_stopped_and_handed_back(tmp_path: Path):
    client = cut_off()
    command = f"trap 'echo term > {tmp_path}/term; exit 143' TERM; touch {tmp_path}/up; {SPIN}"
    run = make_run(client, command, lease_s=1.0, self_fence_margin_s=0.2)
    run.start()
    wait_for_file(tmp_path / "up")
    finish(run)

    assert (tmp_path / "term").read_text() == "term\n", "stopped by SIGTERM, as a preemption stops"
    assert without_tails(client) == [("fail", "j-1", 143, FENCED_ERROR, ("release", True))]


def test_with_the_fence_off_an_attempt_runs_on_while_cut_off(tmp_path: Path):
    client = cut_off()
    # Runs three leases long, each heartbeat failing.
    command = "sleep 1.5"
    run = make_run(client, command, lease_s=0.5, self_fence=False)
    assert run.fence is None
    run.start()
    finish(run)
    assert client.names() == ["done"]


def test_a_server_that_does_not_say_its_lease_leaves_the_attempt_unfenced():
    run = make_run(cut_off(), "true")
    assert run.fence is None


def test_a_checkpointing_attempt_is_hinted_and_its_save_goes_up_before_the_hand_back(tmp_path: Path):
    """The save is worth uploading: if the server was down rather than cut off, this attempt is
    still the job's and the server keeps it (an upload to a server that re-queued meanwhile is
    refused, 409, like the report)."""
    client = cut_off()
    save = 'echo saved > "$CORRAL_CHECKPOINT_OUT"; touch "$CORRAL_CHECKPOINT_DONE_FILE"'
    command = f"trap '{save}' USR1; trap 'exit 143' TERM; touch {tmp_path}/up; {SPIN}"
    run = make_run(client, command, lease_s=2.0, self_fence_margin_s=0.5, checkpoint_mode="auto")
    run.start()
    wait_for_file(tmp_path / "up")
    finish(run)

    assert without_tails(client) == [
        ("upload_checkpoint", "j-1", "w1", 1, None, b"saved\n"),
        ("fail", "j-1", 143, FENCED_ERROR, ("release", True)),
    ]


def test_an_attempt_whose_leases_are_renewed_is_not_fenced(tmp_path: Path):
    """Heartbeats every 50 ms against a fence 1.5 s after each renewal: the job runs to its end."""
    client = FakeClient()
    run = make_run(client, "sleep 2.5", lease_s=2.0, self_fence_margin_s=0.5)
    run.start()
    finish(run)
    assert client.names() == ["done"]


def test_a_server_whose_store_stalls_still_hears_the_attempt_and_it_is_not_fenced():
    """Every heartbeat answered 503 ``store_busy`` for three leases: the server heard them, and it
    counts no silence while its store fails (``core.hearing``), so the attempt runs to its end."""
    client = FakeClient()
    client.heartbeat_error = ApiError(503, "store_busy", "the store's write lock stayed taken")
    run = make_run(client, "sleep 1.5", lease_s=0.5, self_fence_margin_s=0.1)
    run.start()
    finish(run)
    assert client.names() == ["done"]
    # each heartbeat went once: a call that sent it again through the stall would renew nothing
    # until its retries ran out (``fence.HEARTBEAT_BUSY_RETRY_S``)
    assert client.heartbeat_busy_retries and set(client.heartbeat_busy_retries) == {0.0}


@pytest.mark.parametrize(
    ("status", "code", "heard"),
    [
        (503, "store_busy", True),
        (503, "store_unavailable", True),
        (503, "unavailable", False),
        (500, "internal", False),
    ],
)
def test_only_a_store_stall_counts_as_heard(status: int, code: str, heard: bool):
    assert heard_through_a_stall(status, code) is heard


# --- the agent: the lease counts from the claim's sending -------------------------------------


class RetriedClaim(FakeClient):
    """A claim that gets no answer (the server was down), then its retry's answer, once the
    server is back: a run the retry started."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_at: list[float] = []

    def claim(self, worker_id: str, wait_s: float = 0.0, idempotency_key: str | None = None) -> Any:
        self.sent_at.append(time.monotonic())
        if len(self.sent_at) == 1:
            raise ServerUnreachable("http://server", ConnectionError("refused"))
        return claim_answer(lease_s=30.0)


def test_a_claims_run_counts_its_lease_from_the_sending_of_the_claim_that_was_answered(
    monkeypatch: pytest.MonkeyPatch,
):
    """Not from the key's first try: every outage leaves a key to retry, and a run counted from
    before the outage would be fenced the moment the restarted server handed it out."""
    monkeypatch.setattr(JobRun, "start", lambda self: None)
    claims = RetriedClaim()
    agent = make_agent(FakeClient(), poll_s=0.01)
    agent._claims = claims  # type: ignore[assignment]
    agent._registered = True
    agent._claim_once()
    agent._claim_once()
    (run,) = agent._runs.values()
    assert run.fence is not None and run.fence.lease_s == 30.0
    assert claims.sent_at[0] < run.fence.renewed_at <= claims.sent_at[1]
    assert not run.fence.due()


class ClaimThroughAStall(FakeClient):
    """A claim answered only after its call sent it again through a stall (the SDK retries a 503
    ``store_busy`` inside one call): ``last_sent_at`` is the try the server answered."""

    def claim(self, worker_id: str, wait_s: float = 0.0, idempotency_key: str | None = None) -> Any:
        self.first_sent_at = time.monotonic()
        time.sleep(0.05)  # the stall: tries answered 503, then this one
        self.last_sent_at = time.monotonic()
        return claim_answer(lease_s=30.0)


def test_a_claim_answered_after_a_stall_counts_its_lease_from_the_answered_try(
    monkeypatch: pytest.MonkeyPatch,
):
    """A stall longer than the fence's delay must not fence the run its claim then starts."""
    monkeypatch.setattr(JobRun, "start", lambda self: None)
    claims = ClaimThroughAStall()
    agent = make_agent(FakeClient(), poll_s=0.01)
    agent._claims = claims  # type: ignore[assignment]
    agent._registered = True
    agent._claim_once()
    (run,) = agent._runs.values()
    assert run.fence is not None
    assert run.fence.renewed_at == claims.last_sent_at > claims.first_sent_at


def test_an_older_server_without_lease_s_is_said_once(monkeypatch: pytest.MonkeyPatch, caplog):
    monkeypatch.setattr(JobRun, "start", lambda self: None)
    agent = make_agent(FakeClient())
    agent._start_job(claim_answer("j-1"))
    agent._start_job(claim_answer("j-2"))
    assert all(run.fence is None for run in agent._runs.values())
    assert caplog.text.count("without the self-fence") == 1
