"""``corral.jobkit``: beat's rate limit, its no-op outside corral, checkpoints (atomic saves, loads
from the in file or ``CHECKPOINT_DATA``, a gang rank's from the gang directory), the SIGTERM
handler, and no dependencies."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
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


# --- checkpoints -----------------------------------------------------------------------------

BLOB = b"\x00\xffstep=7\r\n\x80"


@pytest.fixture
def outside_corral(monkeypatch) -> None:
    for name in (
        "CORRAL_CHECKPOINT_OUT",
        "CORRAL_CHECKPOINT_IN",
        "CHECKPOINT_DATA",
        "CORRAL_GANG_CHECKPOINT_DIR",
    ):
        monkeypatch.delenv(name, raising=False)


def test_checkpoint_path_is_the_out_file_or_none(monkeypatch, tmp_path: Path, outside_corral):
    assert jobkit.checkpoint_path() is None
    monkeypatch.setenv("CORRAL_CHECKPOINT_OUT", "")
    assert jobkit.checkpoint_path() is None
    monkeypatch.setenv("CORRAL_CHECKPOINT_OUT", str(tmp_path / "checkpoint.out"))
    assert jobkit.checkpoint_path() == str(tmp_path / "checkpoint.out")


def test_a_gang_checkpoint_is_the_rank_file_when_it_exists(monkeypatch, tmp_path: Path, outside_corral):
    assert jobkit.gang_checkpoint_path(0) is None
    assert jobkit.load_gang_checkpoint(0) is None
    monkeypatch.setenv("CORRAL_GANG_CHECKPOINT_DIR", str(tmp_path))
    (tmp_path / "rank-0").write_bytes(BLOB)
    assert jobkit.gang_checkpoint_path(0) == str(tmp_path / "rank-0")
    assert jobkit.load_gang_checkpoint(0) == BLOB
    # rank 1 wrote none: its file is absent
    assert jobkit.gang_checkpoint_path(1) is None
    assert jobkit.load_gang_checkpoint(1) is None


def test_save_checkpoint_writes_the_bytes_and_replaces_the_last_one(
    monkeypatch, tmp_path: Path, outside_corral
):
    out = tmp_path / "checkpoint.out"
    monkeypatch.setenv("CORRAL_CHECKPOINT_OUT", str(out))
    jobkit.save_checkpoint(b"first, and longer than the second")
    jobkit.save_checkpoint(BLOB)
    assert out.read_bytes() == BLOB
    jobkit.save_checkpoint(bytearray(b"\x01\x02"))
    assert out.read_bytes() == b"\x01\x02"
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint.out"]


def test_save_checkpoint_refuses_text(monkeypatch, tmp_path: Path, outside_corral):
    monkeypatch.setenv("CORRAL_CHECKPOINT_OUT", str(tmp_path / "checkpoint.out"))
    with pytest.raises(TypeError, match="bytes"):
        jobkit.save_checkpoint("step=7")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint(monkeypatch, tmp_path: Path, outside_corral):
    out = tmp_path / "checkpoint.out"
    monkeypatch.setenv("CORRAL_CHECKPOINT_OUT", str(out))
    jobkit.save_checkpoint(b"good")

    def interrupted(source: str, destination: str) -> None:
        raise KeyboardInterrupt  # a signal between the write and the rename

    monkeypatch.setattr(jobkit.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        jobkit.save_checkpoint(b"torn")
    assert out.read_bytes() == b"good"
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint.out"]


def test_save_checkpoint_outside_corral_warns_and_writes_nothing(tmp_path: Path, outside_corral):
    with pytest.warns(RuntimeWarning, match="outside corral"):
        assert jobkit.save_checkpoint(BLOB) is None
    assert list(tmp_path.iterdir()) == []


def test_load_checkpoint_prefers_the_in_file(monkeypatch, tmp_path: Path, outside_corral):
    checkpoint_in = tmp_path / "checkpoint.in"
    checkpoint_in.write_bytes(BLOB)
    monkeypatch.setenv("CORRAL_CHECKPOINT_IN", str(checkpoint_in))
    monkeypatch.setenv("CHECKPOINT_DATA", base64.b64encode(b"older inline copy").decode())
    assert jobkit.load_checkpoint() == BLOB


def test_load_checkpoint_falls_back_to_checkpoint_data(monkeypatch, tmp_path: Path, outside_corral):
    monkeypatch.setenv("CHECKPOINT_DATA", base64.b64encode(BLOB).decode())
    assert jobkit.load_checkpoint() == BLOB
    monkeypatch.setenv("CORRAL_CHECKPOINT_IN", str(tmp_path / "missing"))
    assert jobkit.load_checkpoint() == BLOB


def test_load_checkpoint_on_a_first_run_is_none(monkeypatch, outside_corral):
    assert jobkit.load_checkpoint() is None
    monkeypatch.setenv("CHECKPOINT_DATA", "not base64!")
    with pytest.warns(RuntimeWarning, match="base64"):
        assert jobkit.load_checkpoint() is None


def test_a_saved_checkpoint_loads_in_the_next_attempt(monkeypatch, tmp_path: Path, outside_corral):
    """The worker moves the out file of one attempt to the in file of the next; bytes unchanged."""
    monkeypatch.setenv("CORRAL_CHECKPOINT_OUT", str(tmp_path / "out"))
    jobkit.save_checkpoint(bytes(range(256)))
    monkeypatch.setenv("CORRAL_CHECKPOINT_IN", str(tmp_path / "out"))
    assert jobkit.load_checkpoint() == bytes(range(256))


# --- on_preempt ------------------------------------------------------------------------------

# Installs on_preempt (callback: save a checkpoint, log a line with the pid, sleep so a second
# SIGTERM lands during it), optionally forks a child, says "ready", then spins.
PREEMPTABLE = """
import os, sys, time
from corral import jobkit

log = sys.argv[1]

def save():
    with open(log, "a") as out:
        out.write(f"callback {os.getpid()}\\n")
    jobkit.save_checkpoint(b"\\x00\\xffstep=7")
    time.sleep(0.3)
    print("saved")
    if "--raise" in sys.argv:
        raise RuntimeError("the save went wrong")

assert jobkit.on_preempt(save) is save
if "--fork" in sys.argv and os.fork() == 0:
    with open(log + ".child", "w") as out:
        out.write(str(os.getpid()))
    while True:
        time.sleep(0.05)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def run_preemptable(tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CORRAL_CHECKPOINT_OUT": str(tmp_path / "checkpoint.out")}
    process = subprocess.Popen(
        [sys.executable, "-c", PREEMPTABLE, str(tmp_path / "log"), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    return process


def test_on_preempt_runs_the_callback_once_then_exits_143(tmp_path: Path):
    process = run_preemptable(tmp_path)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    process.send_signal(signal.SIGTERM)  # during the callback: ignored
    stdout, stderr = process.communicate(timeout=10)

    assert process.returncode == jobkit.PREEMPT_EXIT_CODE == 143, stderr
    assert stdout == "saved\n"  # flushed before the exit
    assert (tmp_path / "log").read_text() == f"callback {process.pid}\n"
    assert (tmp_path / "checkpoint.out").read_bytes() == b"\x00\xffstep=7"


def test_on_preempt_exits_143_even_when_the_callback_fails(tmp_path: Path):
    process = run_preemptable(tmp_path, "--raise")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=10)

    assert process.returncode == 143
    assert "RuntimeError: the save went wrong" in stderr
    assert (tmp_path / "checkpoint.out").read_bytes() == b"\x00\xffstep=7"


def test_forked_children_die_of_sigterm_without_running_the_callback(tmp_path: Path):
    """The worker signals the whole group: a forked data-loader must not save a checkpoint too."""
    process = run_preemptable(tmp_path, "--fork")
    child_file = tmp_path / "log.child"
    deadline = time.monotonic() + 5
    while not child_file.exists() or not child_file.read_text():
        assert time.monotonic() < deadline, "the forked child never started"
        time.sleep(0.02)
    child = int(child_file.read_text())
    os.killpg(process.pid, signal.SIGTERM)
    process.communicate(timeout=10)

    assert process.returncode == 143
    assert (tmp_path / "log").read_text() == f"callback {process.pid}\n"
    while not _gone(child):
        assert time.monotonic() < deadline, "the forked child survived SIGTERM"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# --- on_checkpoint and defer -----------------------------------------------------------------

# Installs on_checkpoint (callback: log a line with the pid, then return bytes, save them itself,
# or raise, as the flags say), optionally forks a child, says "ready", then counts its steps.
CHECKPOINTABLE = """
import os, sys, time
from corral import jobkit

log = sys.argv[1]
saves = 0

def save():
    global saves
    saves += 1
    with open(log, "a") as out:
        out.write(f"callback {os.getpid()} {saves}\\n")
    if "--raise" in sys.argv:
        raise RuntimeError("the save went wrong")
    if "--itself" in sys.argv:
        jobkit.save_checkpoint(b"itself %d" % saves)
        return None
    return b"returned %d" % saves

assert jobkit.on_checkpoint(save) is save
if "--fork" in sys.argv and os.fork() == 0:
    with open(log + ".child", "w") as out:
        out.write(str(os.getpid()))
    while True:
        time.sleep(0.05)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def run_checkpointable(tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "CORRAL_CHECKPOINT_OUT": str(tmp_path / "checkpoint.out"),
        "CORRAL_CHECKPOINT_DONE_FILE": str(tmp_path / "checkpoint.done"),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", CHECKPOINTABLE, str(tmp_path / "log"), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    return process


def wait_for_path(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.02)


def hint_and_wait(process: subprocess.Popen[str], tmp_path: Path) -> None:
    """SIGUSR1 to the job's group, as the worker sends it; wait for "saved"."""
    done = tmp_path / "checkpoint.done"
    done.unlink(missing_ok=True)
    os.killpg(process.pid, signal.SIGUSR1)
    wait_for_path(done)


def stop(process: subprocess.Popen[str]) -> str:
    os.killpg(process.pid, signal.SIGKILL)
    _, stderr = process.communicate(timeout=10)
    return stderr


@pytest.mark.parametrize(("flag", "saved"), [("", b"returned"), ("--itself", b"itself")])
def test_on_checkpoint_saves_says_saved_and_lets_the_job_run_on(tmp_path: Path, flag: str, saved: bytes):
    process = run_checkpointable(tmp_path, *([flag] if flag else []))
    try:
        hint_and_wait(process, tmp_path)
        assert (tmp_path / "checkpoint.out").read_bytes() == saved + b" 1"
        time.sleep(0.1)
        assert process.poll() is None  # runs on until the stop
        hint_and_wait(process, tmp_path)  # a later request: saved again
        assert (tmp_path / "checkpoint.out").read_bytes() == saved + b" 2"
    finally:
        stop(process)
    assert (tmp_path / "log").read_text() == f"callback {process.pid} 1\ncallback {process.pid} 2\n"


def test_on_checkpoint_says_saved_even_when_the_callback_fails(tmp_path: Path):
    process = run_checkpointable(tmp_path, "--raise")
    try:
        hint_and_wait(process, tmp_path)
        time.sleep(0.1)
        assert process.poll() is None
    finally:
        stderr = stop(process)
    assert "RuntimeError: the save went wrong" in stderr
    assert not (tmp_path / "checkpoint.out").exists()


def test_forked_children_ignore_the_checkpoint_hint(tmp_path: Path):
    process = run_checkpointable(tmp_path, "--fork")
    child_file = tmp_path / "log.child"
    deadline = time.monotonic() + 5
    while not child_file.exists() or not child_file.read_text():
        assert time.monotonic() < deadline, "the forked child never started"
        time.sleep(0.02)
    child = int(child_file.read_text())
    try:
        hint_and_wait(process, tmp_path)
        time.sleep(0.2)
        assert not _gone(child)  # neither killed by the hint
        assert (tmp_path / "log").read_text() == f"callback {process.pid} 1\n"  # nor saving
    finally:
        stop(process)


def test_defer_writes_the_request(monkeypatch, tmp_path: Path):
    request = tmp_path / "defer"
    monkeypatch.setenv("CORRAL_DEFER_FILE", str(request))
    assert jobkit.defer(120) is True
    assert request.read_text() == "120\n"
    assert jobkit.defer(2.5) is True
    assert request.read_text() == "2.5\n"


@pytest.mark.parametrize("seconds", [0, -3, float("nan"), float("inf"), "soon", None])
def test_defer_refuses_what_is_not_a_positive_number(monkeypatch, tmp_path: Path, seconds: object):
    monkeypatch.setenv("CORRAL_DEFER_FILE", str(tmp_path / "defer"))
    assert jobkit.defer(seconds) is False  # type: ignore[arg-type]
    assert not (tmp_path / "defer").exists()


def test_defer_outside_corral_or_unwritable_does_nothing(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("CORRAL_DEFER_FILE", raising=False)
    assert jobkit.defer(60) is False
    monkeypatch.setenv("CORRAL_DEFER_FILE", str(tmp_path / "gone" / "defer"))
    assert jobkit.defer(60) is False


def test_the_hint_counts_as_a_beat_only_for_a_job_that_beats(tmp_path: Path, monkeypatch):
    beat_file = tmp_path / "beat"
    monkeypatch.setenv("CORRAL_BEAT_FILE", str(beat_file))
    jobkit._refresh_beat()
    assert not beat_file.exists()  # never beat: the stall watchdog stays inert
    beat_file.write_text("41\n")
    os.utime(beat_file, (1000, 1000))
    jobkit._refresh_beat()
    assert beat_file.stat().st_mtime > 1000
    assert beat_file.read_text() == "41\n"  # the step shown is unchanged
