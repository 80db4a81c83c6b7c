"""Helpers shared by the worker's unit tests: an attempt or an agent on a scripted client.

Not a test module (pytest collects ``test_*.py`` only); the scripted client itself is
``corral.testing.fake_client.FakeClient``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.config import WorkerSettings
from corral.testing.fake_client import claim_answer
from corral.worker.agent import Agent
from corral.worker.job_run import JobRun
from corral.worker.resources import Offer

FIELDS = {"job_id": "j-1"}


def make_run(
    client: Any, command: str, env: dict[str, str] | None = None, **claim_and_settings: Any
) -> JobRun:
    """An attempt (``j-1``, attempt 1, worker ``w1``) of ``command``, not started. Keyword arguments
    that are ``WorkerSettings`` fields tune the worker (fast heartbeats and grace by default);
    ``final_reports`` is the attempt's batches of final reports (none by default: its own routes);
    the others go into the claim."""
    settings = {"heartbeat_s": 0.05, "preempt_grace_s": 0.5}
    claim: dict[str, Any] = {"job_id": "j-1", "attempt": 1, "command": command, "env": env or {}}
    final_reports = claim_and_settings.pop("final_reports", None)
    for name, value in claim_and_settings.items():
        if name in WorkerSettings.model_fields:
            settings[name] = value
        else:
            claim[name] = value
    return JobRun(
        claim_answer(**claim),
        client,
        WorkerSettings(**settings),
        "w1",
        lambda run: None,
        final_reports=final_reports,
    )


def finish(run: JobRun) -> None:
    assert run.finished.wait(15), "the attempt did not end"


def run_attempt(
    client: Any, command: str, env: dict[str, str] | None = None, **claim_and_settings: Any
) -> None:
    """Run an attempt to its end (see ``make_run``)."""
    run = make_run(client, command, env, **claim_and_settings)
    run.start()
    finish(run)


def wait_for(check: Callable[[], bool], what: str = "condition") -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.02)


def wait_for_file(path: Path) -> None:
    wait_for(path.exists, f"{path}")


def make_agent(client: Any, **settings: Any) -> Agent:
    settings.setdefault("state_dir", tempfile.mkdtemp(prefix="corral-test-state-"))
    agent = Agent(WorkerSettings(**settings), "w1", "host", Offer(1, 1024, 0, 0, None))
    agent._api = client
    return agent
