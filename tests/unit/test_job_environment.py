"""What a job is started with: its environment (GPUs in NVML's order, the gang checkpoint
directory for gang ranks only, the checkpoint phase's files) and the watchdog settings its claim
asks for, with the worker's defaults where the claim's values are unusable."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from corral.config import WorkerSettings
from corral.worker.job_watch import JobProbe, build_watch
from corral.worker.samplers.process import ProcessTreeSampler
from corral.worker.workspace import JobWorkspace
from tests.unit.worker_support import FIELDS


@pytest.mark.parametrize("bad", ["abc", -1, 0, math.nan, math.inf, True, [1]])
def test_bad_durations_in_a_claim_fall_back_to_the_worker_defaults(tmp_path: Path, bad: Any):
    settings = WorkerSettings()
    claim = {"budget_s": bad, "stall_timeout_s": bad}
    probe = JobProbe(os.getpid(), ProcessTreeSampler(), None)
    watch = build_watch(settings, claim, [], tmp_path / "beat", probe, None, FIELDS)
    budget, stall = watch.watchdogs[:2]
    assert budget.budget_s == settings.default_budget_s(False)  # type: ignore[attr-defined]
    assert budget.source == "worker"  # type: ignore[attr-defined]
    assert stall.timeout_s == settings.stall_timeout_s  # type: ignore[attr-defined]


def test_jobs_get_the_pci_bus_device_order():
    workspace = JobWorkspace("j-1", 1)
    try:
        environment = workspace.environment({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, [0, 2], False)
    finally:
        workspace.remove()
    assert environment["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert environment["CUDA_VISIBLE_DEVICES"] == "0,2"


def test_a_gang_rank_always_gets_an_existing_gang_checkpoint_directory():
    workspace = JobWorkspace("j-1", 1)
    try:
        environment = workspace.environment({"CORRAL_GANG_ID": "g-1"}, [], False)
        directory = Path(environment["CORRAL_GANG_CHECKPOINT_DIR"])
        assert directory.is_dir() and list(directory.iterdir()) == []
        assert directory.parent == workspace.directory
    finally:
        workspace.remove()


def test_a_single_job_gets_no_gang_checkpoint_directory(monkeypatch):
    # Not even one leaking from the worker's own environment.
    monkeypatch.setenv("CORRAL_GANG_CHECKPOINT_DIR", "/somewhere")
    workspace = JobWorkspace("j-1", 1)
    try:
        environment = workspace.environment({}, [], False)
    finally:
        workspace.remove()
    assert "CORRAL_GANG_CHECKPOINT_DIR" not in environment


def test_every_job_gets_its_checkpoint_phase_files_in_its_workspace():
    """Where a job says "saved" and asks for more time: files of its own, not there yet (the job
    creates them), overriding any the claim's env names."""
    workspace = JobWorkspace("j-1", 1)
    try:
        environment = workspace.environment(
            {"CORRAL_CHECKPOINT_DONE_FILE": "/tmp/other", "CORRAL_DEFER_FILE": "/tmp/other"}, [], False
        )
        done = Path(environment["CORRAL_CHECKPOINT_DONE_FILE"])
        defer = Path(environment["CORRAL_DEFER_FILE"])
        assert done.parent == defer.parent == workspace.directory
        assert done != defer
        assert not done.exists() and not defer.exists()
    finally:
        workspace.remove()
