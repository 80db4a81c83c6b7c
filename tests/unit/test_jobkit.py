"""``corral.jobkit``: beat's rate limit, its no-op outside corral, and no dependencies."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import jobkit


class Monotonic:
    """``time.monotonic`` as the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Iterator[Monotonic]:
    fake = Monotonic()
    monkeypatch.setattr(jobkit.time, "monotonic", fake)
    jobkit._reset()
    yield fake
    jobkit._reset()


def test_beat_writes_at_most_once_a_second(monkeypatch, tmp_path: Path, clock: Monotonic):
    beat_file = tmp_path / "beat"
    monkeypatch.setenv("CORRAL_BEAT_FILE", str(beat_file))
    writes = []
    for step in range(1, 301):  # 300 steps of 10 ms: 3 seconds
        clock.now = 1000.0 + (step - 1) / 100
        if jobkit.beat(step):
            writes.append((clock.now, beat_file.read_text()))
    assert [text for _, text in writes] == ["1\n", "101\n", "201\n"]
    assert [round(at - 1000.0, 2) for at, _ in writes] == [0.0, 1.0, 2.0]


def test_beat_without_a_step_writes_a_count_of_calls(monkeypatch, tmp_path: Path, clock: Monotonic):
    beat_file = tmp_path / "beat"
    monkeypatch.setenv("CORRAL_BEAT_FILE", str(beat_file))
    assert jobkit.beat()
    assert beat_file.read_text() == "1\n"
    for _ in range(4):
        assert not jobkit.beat()
    clock.now += 1.0
    assert jobkit.beat()
    assert beat_file.read_text() == "6\n"


def test_beat_outside_corral_does_nothing(monkeypatch, tmp_path: Path, clock: Monotonic):
    monkeypatch.delenv("CORRAL_BEAT_FILE", raising=False)
    assert jobkit.beat(3) is False
    monkeypatch.setenv("CORRAL_BEAT_FILE", "")
    assert jobkit.beat(3) is False
    assert list(tmp_path.iterdir()) == []


def test_a_beat_file_that_cannot_be_written_never_breaks_the_job(monkeypatch, tmp_path: Path, clock):
    monkeypatch.setenv("CORRAL_BEAT_FILE", str(tmp_path / "gone" / "beat"))
    assert jobkit.beat(1) is False


def test_jobkit_imports_only_the_standard_library():
    code = (
        "import sys; before = set(sys.modules); import corral.jobkit; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "stdlib = set(sys.stdlib_module_names) | {'corral'}; "
        "print(sorted(new - stdlib))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_torch_example_imports_torch_only_when_run():
    code = "import sys, corral.jobkit.torch; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
