"""``corral up`` without ``--gpus`` on a host where NVML finds no GPU offers fake ones (issue 23:
every ``--gpus`` example of the README pended for ever on a worker of 0 GPUs)."""

from __future__ import annotations

import pytest

from corral.cli.up import DEFAULT_FAKE_GPUS, offered_gpus


def test_no_gpu_found_means_fake_gpus_said_on_stdout(monkeypatch, capsys):
    monkeypatch.delenv("CORRAL_GPUS", raising=False)
    assert offered_gpus(None, lambda: 0) == DEFAULT_FAKE_GPUS
    assert f"offers {DEFAULT_FAKE_GPUS} fake GPUs" in capsys.readouterr().out


@pytest.mark.parametrize("given", [0, 2])
def test_gpus_given_are_honoured_and_nothing_is_detected(monkeypatch, capsys, given):
    monkeypatch.delenv("CORRAL_GPUS", raising=False)

    def detect() -> int:
        raise AssertionError("no detection when --gpus is given")

    assert offered_gpus(given, detect) == given
    assert capsys.readouterr().out == ""


def test_real_gpus_or_corral_gpus_leave_the_worker_to_its_own_detection(monkeypatch):
    monkeypatch.delenv("CORRAL_GPUS", raising=False)
    assert offered_gpus(None, lambda: 4) is None
    monkeypatch.setenv("CORRAL_GPUS", "0")
    assert offered_gpus(None, lambda: 0) is None
