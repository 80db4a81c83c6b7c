"""Authentication end to end: a server with a token file, a worker, the CLI and the SDK sending
``CORRAL_TOKEN``; a token revoked in the file stops working without a restart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.client import ApiError, Client
from tests.e2e.conftest import clean_environment, wait_for, wait_status

pytestmark = pytest.mark.e2e

TOKENS = "tok-admin-e2e admin root\ntok-alice-e2e user alice\ntok-w1-e2e worker w1\n"


def _cli(url: str, token: str | None, *arguments: str) -> subprocess.CompletedProcess[str]:
    env = {**clean_environment(), "CORRAL_SERVER": url}
    if token is not None:
        env["CORRAL_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "corral", *arguments], env=env, capture_output=True, text=True, timeout=30
    )


def test_worker_cli_and_sdk_send_corral_token(tmp_path: Path, start_server, start_worker, monkeypatch):
    token_file = tmp_path / "tokens"
    token_file.write_text(TOKENS)
    server = start_server("--auth-tokens", str(token_file))
    # A root worker with a token runs each job as its user's account: alice's is root here.
    worker = start_worker(
        server.url, "w1", env={"CORRAL_TOKEN": "tok-w1-e2e", "CORRAL_USER_MAP": "alice root"}
    )

    submitted = _cli(server.url, "tok-alice-e2e", "submit", "--user", "mallory", "--json", "--", "echo", "hi")
    assert submitted.returncode == 0, submitted.stderr
    monkeypatch.setenv("CORRAL_TOKEN", "tok-alice-e2e")
    with Client(server.url) as alice:
        job = alice.list_jobs_page().items[0]
        assert job.user == "alice"
        wait_status(alice, job.id, {"done"}, timeout_s=20)

    refused = _cli(server.url, None, "jobs")
    assert refused.returncode == 1 and "unauthenticated" in refused.stderr
    assert "tok-" not in refused.stderr
    drain = _cli(server.url, "tok-alice-e2e", "workers", "drain", "w1")
    assert drain.returncode == 1 and "forbidden" in drain.stderr
    assert _cli(server.url, "tok-admin-e2e", "workers", "drain", "w1").stdout.split() == ["w1", "draining"]
    assert _cli(server.url, "tok-admin-e2e", "workers", "undrain", "w1").stdout.split() == ["w1", "active"]

    token_file.write_text(TOKENS.replace("tok-alice-e2e", "tok-alice-rotated"))

    def revoked() -> bool | None:
        with Client(server.url, token="tok-alice-e2e") as revoked_client:
            try:
                revoked_client.list_jobs_page()
            except ApiError as error:
                return error.status == 401 or None
        return None

    wait_for(revoked, 5.0, "the revoked token to be refused")
    for log in (worker.log(), server.log_path.read_text()):
        assert "tok-" not in log
