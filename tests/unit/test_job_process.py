"""A job's process group: nothing of it outlives a stop (not even a child that left the group),
nothing is signalled once the group is gone, and a stop racing with the exit is not taken for a
stop of a running job."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from corral.worker import executor
from corral.worker.executor import JobProcess

# --- stray process groups and reused PIDs ----------------------------------------------------


def test_a_child_in_its_own_group_does_not_outlive_the_stop():
    process = JobProcess("timeout 100 sleep 101; true", dict(os.environ), 1024, grace_s=0.5)
    deadline = time.monotonic() + 10
    while len(children := psutil.Process(process.pid).children(recursive=True)) < 2:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)
    assert any(os.getpgid(child.pid) != process.pid for child in children)
    try:
        assert process.stop()
        process.finish()
        time.sleep(0.1)
        alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        assert alive == []
    finally:
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()


def test_a_reaped_job_whose_group_is_gone_is_sent_nothing(monkeypatch):
    process = JobProcess("exit 0", dict(os.environ), 1024, grace_s=0.5)
    assert process.wait(5) == 0
    process.finish()
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(executor.os, "killpg", lambda group, number: sent.append((group, number)))
    assert not process.stop()
    assert process.hint(signal.SIGUSR1) == "gone"
    assert sent == []


# --- hints -----------------------------------------------------------------------------------


def _started(command: str, marker: Path) -> JobProcess:
    process = JobProcess(command, dict(os.environ), 1024, grace_s=0.5)
    deadline = time.monotonic() + 10
    while not marker.exists():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)
    return process


def test_a_hint_goes_only_to_a_job_that_handles_it(tmp_path: Path):
    """SIGUSR1's default action ends a process: a job without a handler is not sent it."""
    bare = _started(f"touch {tmp_path}/bare; sleep 30", tmp_path / "bare")
    handled = _started(
        f"trap 'touch {tmp_path}/hinted' USR1; touch {tmp_path}/up; while :; do sleep 0.05; done",
        tmp_path / "up",
    )
    try:
        assert executor.handles_signal(bare.pid, signal.SIGUSR1) is False
        assert bare.hint(signal.SIGUSR1) == "unhandled"
        assert executor.handles_signal(handled.pid, signal.SIGUSR1) is True
        assert handled.hint(signal.SIGUSR1) == "sent"
        deadline = time.monotonic() + 10
        while not (tmp_path / "hinted").exists():
            assert time.monotonic() < deadline, "the hint never arrived"
            time.sleep(0.02)
        assert bare.poll() is None and handled.poll() is None
    finally:
        for process in (bare, handled):
            process.stop()
            process.finish()
    assert handled.hint(signal.SIGUSR1) == "gone"


#: a Python program that handles SIGUSR1 by touching ``<dir>/hinted``, and says it is up
HANDLER = """
import pathlib, signal, sys, time
directory = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGUSR1, lambda *_: (directory / "hinted").touch())
(directory / "up").touch()
for _ in range(600):
    time.sleep(0.05)
"""


@pytest.mark.parametrize(
    "wrapper",
    [
        "{python} {program} {dir}; echo after",  # the shell stays: a command follows
        "bash -c 'cd {dir} && {python} {program} {dir}'",
        "sh -c '{python} {program} {dir}; true' & wait",
    ],
)
def test_the_hint_reaches_the_program_whatever_wraps_it(tmp_path: Path, wrapper: str):
    """Only the process that handles SIGUSR1 gets it: the shells around it would die of it."""
    (tmp_path / "victim.py").write_text(HANDLER)
    command = wrapper.format(python=sys.executable, program=tmp_path / "victim.py", dir=tmp_path)
    process = _started(command, tmp_path / "up")
    try:
        assert executor.handles_signal(process.pid, signal.SIGUSR1, (b"SigCgt",)) is False
        deadline = time.monotonic() + 10
        while process.hint(signal.SIGUSR1) != "sent":
            assert time.monotonic() < deadline, "no process of the job ever handled the hint"
            time.sleep(0.05)
        while not (tmp_path / "hinted").exists():
            assert time.monotonic() < deadline, "the hint never arrived"
            time.sleep(0.02)
        assert process.poll() is None, "a wrapper died of the hint"
    finally:
        process.stop()
        process.finish()


# --- a stop that races with the exit ---------------------------------------------------------


def test_an_exit_hidden_by_the_reaping_lock_is_not_taken_for_a_running_job():
    process = JobProcess("exit 0", dict(os.environ), 1024, grace_s=0.5)
    deadline = time.monotonic() + 5
    # Exited but not reaped (a zombie), while another thread "holds" the lock: poll says None.
    while executor.is_live_member(process.pid, process.pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    real_poll = process._popen.poll
    process._popen.poll = lambda: None  # type: ignore[method-assign]
    try:
        assert not process.stop()
    finally:
        process._popen.poll = real_poll  # type: ignore[method-assign]
    assert process.wait(5) == 0
    process.finish()
    assert not process.stopped_while_running


def test_a_job_whose_output_cannot_be_drained_leaves_no_descriptor_open(monkeypatch):
    """The output pipe's read end is a bare descriptor (no file object to close it when dropped):
    a start that fails after the job's process was made (here the pump refuses the pipe) closes it,
    and the pidfd, before the error goes to the caller."""

    class RefusingPump:
        def add(self, *_args: object) -> None:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(executor, "shared_pump", RefusingPump)
    executor._devnull()  # opened once for every job, kept
    open_before = _pipes_and_pidfds()
    with pytest.raises(OSError, match="No space left"):
        JobProcess("true", dict(os.environ), 1024, grace_s=0.5)
    assert _pipes_and_pidfds() == open_before


def _pipes_and_pidfds() -> set[str]:
    """This process's descriptors on pipes and pidfds, with what each points to."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(("pipe:", "anon_inode:[pidfd]")):
            found.add(f"{name} {target}")
    return found
