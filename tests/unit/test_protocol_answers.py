"""The answer models of the wire contract: what the server sends holds to them, what breaks them
is refused, additions pass (API.md allows them), and scripts written for plain dictionaries still
read them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from corral.domain.records import JobEvent, Reason
from corral.domain.status import Status
from corral.protocol.answers import ClaimAnswer, EventAnswer, JobAnswer
from corral.protocol.wire import event_to_wire, job_to_wire
from corral.testing.factories import gang, gpu_job
from corral.testing.fake_client import claim_answer


def test_every_job_the_server_can_describe_holds_to_the_job_model():
    jobs = [gpu_job(gpus=2, reason=Reason("queued", "waiting"), progress={"step": 3}), *gang(3, gpus=1).tasks]
    for status in Status:
        wire = job_to_wire(gpu_job(status=status))
        assert JobAnswer.model_validate(wire).status == status.value
    for job in jobs:
        parsed = JobAnswer.model_validate(job_to_wire(job))
        assert parsed.to_wire() == {**job_to_wire(job)}


def test_an_event_keeps_its_wire_name_from():
    event = JobEvent("j-1", 1.0, Status.PENDING, Status.RUNNING, Reason("claimed", "by w1"), None, "w1", 1)
    parsed = EventAnswer.model_validate(event_to_wire(event))
    assert (parsed.from_status, parsed["from"], parsed.to_wire()["from"]) == ("pending", "pending", "pending")


@pytest.mark.parametrize(
    "entries",
    [
        "rank-0",
        [{"gang_index": "zero", "job_id": "j-0"}],
        [{"gang_index": 0}],
        [["j-0"]],
    ],
)
def test_a_claim_with_malformed_gang_checkpoints_is_refused(entries):
    with pytest.raises(ValidationError):
        claim_answer(gang_checkpoints=entries)


def test_additions_pass_and_item_access_reads_like_the_old_dictionaries():
    claim = ClaimAnswer.model_validate(
        {
            "id": "j-1",
            "attempt": 2,
            "command": "true",
            "status": "running",
            "submitted_at": "2026-01-01T00:00:00.000Z",
            "a_field_from_a_newer_server": {"x": 1},
        }
    )
    assert claim.to_wire()["a_field_from_a_newer_server"] == {"x": 1}
    assert (claim["id"], claim["attempt"], claim.get("missing", "default")) == ("j-1", 2, "default")
    with pytest.raises(KeyError):
        claim["missing"]
    with pytest.raises(ValidationError):
        JobAnswer.model_validate({"id": "j-1", "command": "true", "status": "sleeping", "submitted_at": "x"})
