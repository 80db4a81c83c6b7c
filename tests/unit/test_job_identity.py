"""What a job gets of its host: the environment API.md lists (never the worker's token), and a
workdir the account can enter; ``corral submit`` sends its directory."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from corral.cli import submit
from corral.worker import identity
from corral.worker.identity import Account

STRANGER = Account("stranger", 54321, 54321, (54321,), "/home/stranger", "/bin/bash")


def test_only_the_listed_variables_of_the_worker_reach_a_job():
    worker = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TZ": "UTC",
        "CORRAL_TOKEN": "secret",
        "AWS_SECRET_ACCESS_KEY": "x",
        "HOME": "/root",
        "PYTHONPATH": "/src",
    }
    environment = identity.base_environment(STRANGER, worker)
    assert environment == {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TZ": "UTC",
        "HOME": "/home/stranger",
        "USER": "stranger",
        "LOGNAME": "stranger",
        "SHELL": "/bin/bash",
    }


def test_a_workspace_environment_leaves_the_token_out(monkeypatch):
    from corral.worker.workspace import JobWorkspace

    monkeypatch.setenv("CORRAL_TOKEN", "secret")
    workspace = JobWorkspace("j-1", 1)
    try:
        environment = workspace.environment({"CORRAL_JOB_ID": "j-1", "MINE": "1"}, [], False, STRANGER)
    finally:
        workspace.remove()
    assert "CORRAL_TOKEN" not in environment
    assert environment["MINE"] == "1" and environment["HOME"] == "/home/stranger"


def test_a_workdir_must_exist_be_a_directory_and_be_enterable(tmp_path: Path):
    me = identity.worker_account()
    assert identity.unenterable(str(tmp_path), me) is None
    assert "No such file" in (identity.unenterable(str(tmp_path / "gone"), me) or "")
    (tmp_path / "file").write_text("")
    assert "not a directory" in (identity.unenterable(str(tmp_path / "file"), me) or "")
    assert "absolute" in (identity.unenterable("relative", me) or "")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert "may not enter" in (identity.unenterable(str(private), STRANGER) or "")
    assert identity.unenterable("/", STRANGER) is None  # mode 755: anyone may enter


def _arguments(**given: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    submit.add_parser(commands, argparse.ArgumentParser(add_help=False))
    words = ["submit"]
    for name, value in given.items():
        flag = "--" + name.replace("_", "-")
        words += [flag] if value is True else [flag, str(value)]
    return parser.parse_args([*words, "--", "true"])


def test_submit_sends_its_directory_unless_told_otherwise(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert submit.build_body(_arguments())["workdir"] == str(tmp_path)
    assert submit.build_body(_arguments(workdir="sub"))["workdir"] == str(tmp_path / "sub")
    assert "workdir" not in submit.build_body(_arguments(no_workdir=True))


def test_the_user_map_takes_lines_or_a_file(tmp_path: Path):
    assert identity.parse_user_map("alice a1\nbob b2 # comment\n\n") == {"alice": "a1", "bob": "b2"}
    assert identity.parse_user_map("alice a1, bob b2") == {"alice": "a1", "bob": "b2"}
    (tmp_path / "map").write_text("carol c3\n")
    assert identity.parse_user_map(str(tmp_path / "map")) == {"carol": "c3"}
    assert identity.parse_user_map(None) == {}


def test_without_switching_every_job_runs_as_the_worker():
    accounts = identity.Accounts(switching=False)
    assert accounts.of("anyone") == identity.worker_account()
    assert accounts.enforcement == "none"


def test_a_user_without_an_account_is_refused():
    accounts = identity.Accounts(switching=True, user_map={"alice": "no-such-account-here"})
    for user in ("alice", "nobody-by-this-name", None):
        try:
            accounts.of(user)
        except identity.NoSuchAccount:
            continue
        raise AssertionError(f"{user!r} got an account")
    assert accounts.of("root").uid == 0


def test_a_root_worker_without_auth_runs_jobs_only_for_loopback(monkeypatch):
    from corral.config import WorkerSettings
    from corral.worker.main import root_without_auth

    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert root_without_auth(WorkerSettings(server="http://127.0.0.1:8765")) is None
    assert "--allow-root-jobs" in (root_without_auth(WorkerSettings(server="http://gpu-head:8765")) or "")
    assert root_without_auth(WorkerSettings(server="http://gpu-head:8765", allow_root_jobs=True)) is None
    monkeypatch.setenv("CORRAL_TOKEN", "tok")
    assert root_without_auth(WorkerSettings(server="http://gpu-head:8765")) is None
