import pytest

from corral.domain.clock import to_rfc3339
from corral.domain.resources import Resources
from corral.domain.status import ALLOWED_TRANSITIONS, HOLDING, TERMINAL, Status, is_allowed


def test_resources_add_and_subtract_exactly():
    worker = Resources(gpus=8, vram_mb=80_000, memory_mb=1_000, cpus=64)
    a = Resources(gpus=3, vram_mb=40_000, memory_mb=300, cpus=10)
    b = Resources(gpus=5, vram_mb=80_000, memory_mb=700, cpus=54)
    used = a + b
    assert used == Resources(gpus=8, vram_mb=80_000, memory_mb=1_000, cpus=64)
    assert worker.minus(used) == Resources(gpus=0, vram_mb=80_000, memory_mb=0, cpus=0)


@pytest.mark.parametrize(
    ("request_", "fits", "missing"),
    [
        (Resources(gpus=2, vram_mb=80_000), True, []),
        (Resources(gpus=3), False, ["gpus"]),
        (Resources(gpus=1, vram_mb=80_001), False, ["vram_mb"]),
        (Resources(vram_mb=999_999), True, []),  # a CPU job asks for no GPU memory
        (Resources(memory_mb=1_001, cpus=5), False, ["memory_mb", "cpus"]),
    ],
)
def test_covers_and_shortfall(request_, fits, missing):
    free = Resources(gpus=2, vram_mb=80_000, memory_mb=1_000, cpus=4)
    assert free.covers(request_) is fits
    assert free.shortfall(request_) == missing


def test_every_status_has_a_row_and_terminal_statuses_go_nowhere():
    assert set(ALLOWED_TRANSITIONS) == set(Status)
    for status in TERMINAL:
        assert ALLOWED_TRANSITIONS[status] == frozenset()
    assert {Status.RESERVED, Status.RUNNING, Status.PREEMPTING} == HOLDING


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        (None, Status.PENDING, True),
        (None, Status.BLOCKED, True),
        (None, Status.RUNNING, False),
        (Status.PENDING, Status.RUNNING, True),
        (Status.RUNNING, Status.DONE, True),
        (Status.PENDING, Status.DONE, False),
        (Status.DONE, Status.PENDING, False),
        (Status.PREEMPTING, Status.RUNNING, False),
        (Status.RESERVED, Status.RUNNING, True),
        (Status.CANCELLED, Status.PENDING, False),
    ],
)
def test_transition_table(source, target, allowed):
    assert is_allowed(source, target) is allowed


def test_rfc3339_is_utc_with_z():
    assert to_rfc3339(0.0) == "1970-01-01T00:00:00.000Z"
    assert to_rfc3339(1_800_000_000.25) == "2027-01-15T08:00:00.250Z"
    assert to_rfc3339(None) is None
