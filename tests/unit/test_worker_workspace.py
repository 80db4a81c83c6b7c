"""Job directories handed on from one attempt to the next (``corral.worker.workspace``): only an
empty one, never to two attempts at once, and the kept ones removed at the end."""

from __future__ import annotations

import os
from pathlib import Path

from corral.worker.workspace import JobWorkspace, WorkspacePool


def test_an_empty_directory_is_handed_to_the_next_attempt():
    pool = WorkspacePool()
    first = pool.take()
    pool.give_back(first)
    assert pool.take() == first
    os.rmdir(first)


def test_a_directory_the_job_wrote_to_is_removed_not_handed_on():
    pool = WorkspacePool()
    first = pool.take()
    (Path(first) / "checkpoint.out").write_bytes(b"state")
    (Path(first) / "gang-checkpoints").mkdir()
    pool.give_back(first)
    assert not os.path.exists(first)
    second = pool.take()
    assert second != first
    assert os.listdir(second) == []
    os.rmdir(second)


def test_past_its_limit_the_pool_removes_what_it_is_given():
    pool = WorkspacePool(limit=1)
    one, two = pool.take(), pool.take()
    pool.give_back(one)
    pool.give_back(two)
    assert os.path.isdir(one)
    assert not os.path.exists(two)
    pool.clear()
    assert not os.path.exists(one)


def test_attempts_running_at_once_get_directories_of_their_own():
    workspaces = [JobWorkspace(f"j-{number}", 1) for number in range(5)]
    try:
        assert len({workspace.directory for workspace in workspaces}) == 5
    finally:
        for workspace in workspaces:
            workspace.remove()


def test_removing_a_workspace_twice_hands_its_directory_on_once():
    workspace = JobWorkspace("j-1", 1)
    workspace.remove()
    workspace.remove()
    first, second = JobWorkspace("j-2", 1), JobWorkspace("j-3", 1)
    try:
        assert first.directory != second.directory
    finally:
        first.remove()
        second.remove()
