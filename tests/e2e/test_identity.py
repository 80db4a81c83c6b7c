"""A job runs as its user's Unix account (issue 21, identity), end to end, as root: a server with
auth, a root worker with a token, two accounts the test creates (and removes, even on failure)."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.client import Client
from corral.worker import identity
from tests.e2e.conftest import wait_status

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root and useradd"),
]


@pytest.fixture
def accounts() -> Iterator[tuple[str, str]]:
    """Two fresh Unix accounts, removed afterwards whatever happened."""
    suffix = secrets.token_hex(3)
    names = (f"crl-a-{suffix}", f"crl-b-{suffix}")
    made = []
    try:
        for name in names:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
            made.append(name)
        yield names
    finally:
        for name in made:
            subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every account may write to (the tests' own tmp_path is root's alone)."""
    directory = Path(tempfile.mkdtemp(prefix="corral-identity-"))
    os.chmod(directory, 0o777)  # noqa: S103 - the test's jobs, of several accounts, write here
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_each_job_runs_as_its_users_account_and_sees_nothing_of_the_worker(
    start_server, start_worker, tmp_path: Path, accounts: tuple[str, str], shared_dir: Path
):
    alice_account, bob_account = accounts
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-w1 worker w1\ntok-alice user alice\ntok-bob user bob\ntok-carol user carol\n")
    server = start_server("--auth-tokens", str(tokens))
    start_worker(
        server.url,
        "w1",
        env={"CORRAL_TOKEN": "tok-w1", "CORRAL_USER_MAP": f"alice {alice_account}\nbob {bob_account}"},
    )
    private = shared_dir / "alice-private"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("alice's")
    alice_pw = pwd.getpwnam(alice_account)
    os.chown(private, alice_pw.pw_uid, alice_pw.pw_gid)
    os.chown(private / "secret", alice_pw.pw_uid, alice_pw.pw_gid)
    out = shared_dir

    alice, bob, carol = (Client(server.url, token=f"tok-{name}") for name in ("alice", "bob", "carol"))
    with alice, bob, carol:
        probe = (
            f"id -u > {out}/uid; env > {out}/env; echo $HOME > {out}/home; "
            f"cat /proc/$PPID/environ > /dev/null 2>&1; echo $? > {out}/ppid-environ; "
            f'echo saved > "$CORRAL_CHECKPOINT_OUT"; stat -c %u "$CORRAL_CHECKPOINT_OUT" > {out}/owner; '
            f"stat -c %u . > {out}/cwd-owner; umask > {out}/umask; cat secret > {out}/alice-read"
        )
        first = alice.submit_body({"command": probe, "workdir": str(private)})["id"]
        snoop = bob.submit_body({"command": f"cat {private}/secret > {out}/bob-read 2>&1; true"})["id"]
        trespass = bob.submit_body({"command": "true", "workdir": str(private), "max_retries": 3})["id"]
        nobody = carol.submit_body({"command": "true", "max_retries": 3})["id"]

        assert wait_status(alice, first, {"done", "failed"}, 30)["status"] == "done"
        assert wait_status(bob, snoop, {"done", "failed"}, 30)["status"] == "done"
        refused = wait_status(bob, trespass, {"done", "failed"}, 30)
        assert (refused["status"], refused["reason"]["code"]) == ("failed", "workdir_unavailable")
        unknown = wait_status(carol, nobody, {"done", "failed"}, 30)
        assert (unknown["status"], unknown["reason"]["code"]) == ("failed", "no_such_account")
        assert unknown["attempts"] == 1

    assert (out / "uid").read_text().strip() == str(alice_pw.pw_uid)
    assert (out / "home").read_text().strip() == alice_pw.pw_dir
    names = {line.partition("=")[0] for line in (out / "env").read_text().splitlines()}
    assert "CORRAL_TOKEN" not in names and "CORRAL_USER_MAP" not in names
    assert (out / "ppid-environ").read_text().strip() != "0", "the worker's environ was readable"
    assert (out / "owner").read_text().strip() == str(alice_pw.pw_uid)
    assert (out / "alice-read").read_text() == "alice's"
    assert (out / "cwd-owner").read_text().strip() == str(alice_pw.pw_uid)
    assert int((out / "umask").read_text(), 8) == identity.login_umask()
    assert "Permission denied" in (out / "bob-read").read_text()
