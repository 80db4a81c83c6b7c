"""Gangs end to end: a real server, two real workers, real ranks, real signals (seeds 000 and 001).

What a person sees when they submit ``corral submit --gang-size 2 --gpus 1 -- python train.py`` to
two local workers: both ranks start and find each other through ``MASTER_ADDR:MASTER_PORT``; a
rank's crash stops its peer with SIGTERM (SIGKILL after the grace if it will not stop) and the
whole gang runs again; a checkpoint the peer writes on its way out is in its next attempt.

The ranks name their marker files after ``RANK`` and ``CORRAL_ATTEMPT``: the attempt number only
grows, for the rank that crashed and for the peers its crash stopped alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.client import Client
from tests.e2e.conftest import (
    ServerProcess,
    clean_environment,
    gang_cluster,
    log_records,
    process_gone,
    submit_gang,
    wait_for,
    wait_gang,
)

pytestmark = pytest.mark.e2e

GPU_WORKER_FLAGS = ("--gpus", "1", "--vram-mb", "16000", "--gpu-model", "FakeGPU")
CHECKPOINT = b"\x00\xffstep=7"

# $d the directory for markers, $r the rank, $n the attempt.
RANK_AND_ATTEMPT = "d={dir}; r=$RANK; n=$CORRAL_ATTEMPT; "

# Rank 1's first attempt waits for rank 0's first attempt to be up (its trap installed), then crashes.
CRASH_RANK_1 = (
    "[ $r = 1 ] && [ $n = 1 ] && { i=0; while [ ! -e $d/up-0-1 ]; do i=$((i+1)); [ $i -gt 200 ] && exit 9; "
    "sleep 0.05; done; echo crashing > $d/crash-1-1; exit 1; }; "
)


def wait_file(path: Path, timeout_s: float = 10.0) -> Path:
    wait_for(path.exists, timeout_s, f"{path.name} to appear")
    return path


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


# --- a. rendezvous ---------------------------------------------------------------------------

RENDEZVOUS = """
import os, socket, sys, time
out = sys.argv[1]
rank = os.environ["RANK"]
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GANG_PEERS", "MASTER_ADDR", "MASTER_PORT",
         "CUDA_VISIBLE_DEVICES", "GANG_SIZE", "GANG_INDEX")
with open(f"{out}/env-{rank}", "w") as env_file:
    env_file.writelines(f"{name}={os.environ.get(name, '')}\\n" for name in names)
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if rank == "0":
    with socket.create_server(master) as listener:
        listener.settimeout(10)
        connection, _ = listener.accept()
        with connection:
            heard = connection.recv(100)
            connection.sendall(b"hello from rank 0")
else:
    deadline = time.monotonic() + 10
    while True:
        try:
            connection = socket.create_connection(master, timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with connection:
        connection.sendall(b"hello from rank 1")
        heard = connection.recv(100)
with open(f"{out}/heard-{rank}", "wb") as heard_file:
    heard_file.write(heard)
"""


def test_both_ranks_start_with_a_working_rendezvous(start_server, start_worker, tmp_path: Path):
    server, _ = gang_cluster(start_server, start_worker, *GPU_WORKER_FLAGS)
    script = tmp_path / "rendezvous.py"
    script.write_text(RENDEZVOUS)
    with Client(server.url) as client:
        tasks = submit_gang(client, f"{sys.executable} {script} {tmp_path}", resources={"gpus": 1})
        gang = wait_gang(client, tasks[0])

    assert gang["status"] == "done", gang
    assert [task["status"] for task in gang["tasks"]] == ["done", "done"]
    assert {task["worker_id"] for task in gang["tasks"]} == {"w0", "w1"}
    assert (tmp_path / "heard-0").read_bytes() == b"hello from rank 1"
    assert (tmp_path / "heard-1").read_bytes() == b"hello from rank 0"
    for rank in (0, 1):
        env = read_env(tmp_path / f"env-{rank}")
        assert (env["RANK"], env["GANG_INDEX"], env["WORLD_SIZE"], env["GANG_SIZE"]) == (
            str(rank),
            str(rank),
            "2",
            "2",
        )
        assert env["LOCAL_RANK"] == "0"  # one rank per worker
        assert env["GANG_PEERS"] == "127.0.0.1,127.0.0.1"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert read_env(tmp_path / "env-0")["MASTER_PORT"] == read_env(tmp_path / "env-1")["MASTER_PORT"]


# --- b. a crashing rank restarts the gang ----------------------------------------------------


def test_a_crashing_rank_stops_its_peer_and_the_gang_runs_again(start_server, start_worker, tmp_path: Path):
    server, _ = gang_cluster(start_server, start_worker)
    command = (
        RANK_AND_ATTEMPT.format(dir=tmp_path)
        + CRASH_RANK_1
        + "[ $r = 0 ] && [ $n = 1 ] && { trap 'echo term > $d/term-0-1; exit 143' TERM; "
        "echo up > $d/up-0-1; while :; do sleep 0.05; done; }; "
        "echo ran > $d/ran-$r-$n"
    )
    with Client(server.url) as client:
        rank0, rank1 = submit_gang(client, command)
        gang = wait_gang(client, rank0)
        events = events_by_cli(server, rank0)
        trigger_events = client.events(rank1)

    assert gang["status"] == "done", gang
    assert (tmp_path / "term-0-1").read_text() == "term\n"
    assert (tmp_path / "ran-0-2").exists() and (tmp_path / "ran-1-2").exists()
    assert not (tmp_path / "ran-0-1").exists()
    assert [event["to"] for event in events] == [
        "blocked",
        "reserved",
        "running",
        "preempting",
        "preempted",
        "blocked",
        "reserved",
        "running",
        "done",
    ], events
    # The crashed rank has no process to stop: straight to preempted, no ack awaited.
    assert [event["to"] for event in trigger_events][2:6] == ["running", "preempted", "blocked", "reserved"]
    epochs = {event["epoch"] for event in events if event["to"] in ("preempting", "preempted")}
    assert len(epochs) == 1 and None not in epochs, events


def events_by_cli(server: ServerProcess, job_id: str) -> list[dict[str, Any]]:
    """``corral events JOB --json``, as a person would read the drain."""
    done = subprocess.run(
        [sys.executable, "-m", "corral", "events", job_id, "--server", server.url, "--json"],
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=20,
        check=True,
    )
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return items


# --- c. a peer that ignores SIGTERM ----------------------------------------------------------


def test_a_peer_ignoring_sigterm_is_killed_and_the_gang_runs_again(
    start_server, start_worker, reap_groups: list[int], tmp_path: Path
):
    server, workers = gang_cluster(start_server, start_worker)
    command = (
        RANK_AND_ATTEMPT.format(dir=tmp_path)
        + CRASH_RANK_1
        + "[ $r = 0 ] && [ $n = 1 ] && { trap '' TERM; echo $$ > $d/pid-0-1; "
        "echo up > $d/up-0-1; while :; do sleep 0.05; done; }; "
        "echo ran > $d/ran-$r-$n"
    )
    with Client(server.url) as client:
        rank0, _ = submit_gang(client, command)
        wait_file(tmp_path / "up-0-1")
        reap_groups.append(int((tmp_path / "pid-0-1").read_text()))
        gang = wait_gang(client, rank0)

    assert gang["status"] == "done", gang
    assert (tmp_path / "ran-0-2").exists() and (tmp_path / "ran-1-2").exists()
    assert process_gone(int((tmp_path / "pid-0-1").read_text()))
    killed = log_records(workers, "job did not stop within the grace period; sent SIGKILL")
    assert [record["job_id"] for record in killed] == [rank0]
    [stopped] = log_records(workers, "job stopped; acknowledging")
    assert (stopped["job_id"], stopped["exit_code"]) == (rank0, 137)  # SIGKILL, not its own exit


# --- d. a checkpoint written on SIGTERM is in the next attempt --------------------------------

CHECKPOINTING = """
import base64, json, os, sys, time
from corral import jobkit
out, rank = sys.argv[1], os.environ["RANK"]
run = int(os.environ["CORRAL_ATTEMPT"])
if run == 1 and rank == "1":
    while not os.path.exists(f"{out}/up-0-1"):
        time.sleep(0.05)
    sys.exit(1)
if run == 1:
    jobkit.on_preempt(lambda: jobkit.save_checkpoint(b"\\x00\\xffstep=7"))
    open(f"{out}/up-0-1", "w").close()
    while True:
        time.sleep(0.05)
seen = {
    "resume": os.environ.get("CORRAL_RESUME"),
    "in_path": os.environ.get("CORRAL_CHECKPOINT_IN"),
    "out_path": os.environ.get("CORRAL_CHECKPOINT_OUT"),
    "has_data": "CHECKPOINT_DATA" in os.environ,
    "gang_dir": sorted(os.listdir(os.environ["CORRAL_GANG_CHECKPOINT_DIR"])),
}
rank0 = jobkit.load_gang_checkpoint(0)
if rank0 is not None:
    open(f"{out}/gang-rank-0-{rank}-{run}", "wb").write(rank0)
open(f"{out}/seen-{rank}-{run}.json", "w").write(json.dumps(seen))
if seen["in_path"]:
    open(f"{out}/in-{rank}-{run}", "wb").write(open(seen["in_path"], "rb").read())
if seen["has_data"]:
    open(f"{out}/data-{rank}-{run}", "wb").write(base64.b64decode(os.environ["CHECKPOINT_DATA"]))
loaded = jobkit.load_checkpoint()
if loaded is not None:
    open(f"{out}/loaded-{rank}-{run}", "wb").write(loaded)
"""


def test_a_checkpoint_written_on_sigterm_is_in_the_next_attempt(start_server, start_worker, tmp_path: Path):
    server, workers = gang_cluster(start_server, start_worker)
    script = tmp_path / "checkpointing.py"
    script.write_text(CHECKPOINTING)
    with Client(server.url) as client:
        rank0, rank1 = submit_gang(client, f"{sys.executable} {script} {tmp_path}")
        gang = wait_gang(client, rank0)
        stored = client.download_checkpoint(rank0)
        stored_for_rank1 = client.download_checkpoint(rank1)

    assert gang["status"] == "done", gang
    seen = json.loads((tmp_path / "seen-0-2.json").read_text())
    assert seen["resume"] == "1"
    assert seen["in_path"] and seen["in_path"] != seen["out_path"]
    assert (tmp_path / "in-0-2").read_bytes() == CHECKPOINT
    assert (tmp_path / "data-0-2").read_bytes() == CHECKPOINT
    assert (tmp_path / "loaded-0-2").read_bytes() == CHECKPOINT
    assert stored == CHECKPOINT
    # The crashing rank wrote none: it has no checkpoint of its own, but is told to resume (a rank
    # of its gang has one) and finds rank 0's in the gang directory, as rank 0 does.
    seen1 = json.loads((tmp_path / "seen-1-2.json").read_text())
    assert (seen1["resume"], seen1["in_path"], seen1["has_data"]) == ("1", None, False)
    assert stored_for_rank1 is None
    for rank in (0, 1):
        assert json.loads((tmp_path / f"seen-{rank}-2.json").read_text())["gang_dir"] == ["rank-0"]
        assert (tmp_path / f"gang-rank-0-{rank}-2").read_bytes() == CHECKPOINT
    # The handler saved and exited at once: no SIGKILL, the stop ended with the handler's 143.
    [stopped] = log_records(workers, "job stopped; acknowledging")
    assert (stopped["job_id"], stopped["exit_code"]) == (rank0, 143)
    assert not log_records(workers, "job did not stop within the grace period; sent SIGKILL")
    [uploaded] = log_records(workers, "checkpoint uploaded")
    assert (uploaded["job_id"], uploaded["bytes"]) == (rank0, len(CHECKPOINT))


# --- e. ranks that die on their own keep their checkpoints -----------------------------------

# Each rank runs steps 1..6, saving its step to $CORRAL_CHECKPOINT_OUT after each, and resumes after
# the step in its own checkpoint, else in its rank's file in the gang directory. A run that did not
# resume dies at step 3: rank 1 crashes right after saving it; rank 0 exits 1 by itself a moment
# later, as a rank whose collective lost its peer does, long before a heartbeat could stop it.
# What each attempt saw goes to $d/seen-$r-$n, the steps it ran to $d/steps-$r-$n.
STEPS_THAT_DIE_AT_3 = (
    'start=0; from=none; own="$CORRAL_GANG_CHECKPOINT_DIR/rank-$r"; '
    'if [ -n "$CORRAL_CHECKPOINT_IN" ]; then start=$(cat "$CORRAL_CHECKPOINT_IN"); from=own; '
    'elif [ -f "$own" ]; then start=$(cat "$own"); from=gang; fi; '
    'echo "resume=${CORRAL_RESUME:-0} start=$start from=$from '
    'gang=$(ls "$CORRAL_GANG_CHECKPOINT_DIR" | tr "\\n" " ")" > $d/seen-$r-$n; '
    "step=$start; "
    "while [ $step -lt 6 ]; do step=$((step+1)); "
    'echo $step > "$CORRAL_CHECKPOINT_OUT"; echo $step >> $d/steps-$r-$n; '
    "if [ $step = 3 ] && [ $start = 0 ]; then "
    "[ $r = 1 ] && { echo crashed > $d/crashed-1-$n; exit 3; }; "
    "i=0; while [ ! -e $d/crashed-1-$n ] && [ $i -lt 1000 ]; do i=$((i+1)); sleep 0.01; done; "
    "sleep 0.05; exit 1; fi; "
    "sleep 0.05; done"
)


def test_ranks_that_die_on_their_own_resume_from_their_checkpoints(
    start_server, start_worker, tmp_path: Path
):
    server, _ = gang_cluster(start_server, start_worker)
    command = RANK_AND_ATTEMPT.format(dir=tmp_path) + STEPS_THAT_DIE_AT_3
    with Client(server.url) as client:
        rank0, rank1 = submit_gang(client, command, max_retries=2)
        gang = wait_gang(client, rank0, timeout_s=30)
        events = {rank: client.events(job_id) for rank, job_id in ((0, rank0), (1, rank1))}

    seen = {path.name: path.read_text().strip() for path in tmp_path.glob("seen-*")}
    steps = {path.name: path.read_text().split() for path in tmp_path.glob("steps-*")}
    assert gang["status"] == "done", (gang["status"], seen, steps)
    for rank in (0, 1):
        assert steps[f"steps-{rank}-1"] == ["1", "2", "3"]
        assert steps[f"steps-{rank}-2"] == ["4", "5", "6"]
        # Each resumed from its own checkpoint, and sees both ranks' in the gang directory.
        assert seen[f"seen-{rank}-1"] == "resume=0 start=0 from=none gang="
        assert seen[f"seen-{rank}-2"] == "resume=1 start=3 from=own gang=rank-0 rank-1"
    # One drain: each rank stopped once, in one preemption epoch, and ran twice.
    for rank, history in events.items():
        targets = [event["to"] for event in history]
        assert targets.count("preempted") == 1 and targets.count("running") == 2, (rank, targets)
    epochs = {
        event["epoch"] for history in events.values() for event in history if event["to"] == "preempted"
    }
    assert len(epochs) == 1, events
