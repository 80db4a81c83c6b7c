"""What a job gets of its host: the environment API.md lists (never the worker's token), and a
workdir the account can enter; ``corral submit`` sends its directory."""

from __future__ import annotations

import argparse
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
