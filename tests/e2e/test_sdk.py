"""The SDK as a script uses it (issue 23): ``Client.submit`` and its handles against a real server
and two real workers. For a job, a gang and an array: submit, wait, read the output (stored, and
followed live), cancel. A job waits on a file the test creates, so "live" is proven by order
(the first line arrives before the job may write the second), never by timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.client import (
    ApiError,
    ArrayHandle,
    Client,
    GangHandle,
    JobHandle,
    WaitTimeout,
)
from corral.worker.calls import WorkerClient
from tests.e2e.sdk_cluster import running_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: waits (at most a minute) for the file $1 to exist
GATE = "i=0; while [ ! -e {gate} ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 9; sleep 0.05; done"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    with running_cluster(tmp_path_factory.mktemp("sdk")) as url, Client(url) as connected:
        yield connected


def gated(gate: Path, before: str, after: str) -> str:
    """A command that prints ``before``, waits for ``gate`` to exist, then prints ``after``."""
    return f"echo {before}; {GATE.format(gate=gate)}; echo {after}"


# --- a job -----------------------------------------------------------------------------------


def test_a_job_is_submitted_waited_for_and_its_output_read(client: Client):
    job = client.submit("echo out; echo err >&2; exit 0", cpus=1, name="sdk-job", env={"WHO": "me"})
    assert isinstance(job, JobHandle) and job.id.startswith("j-")
    ended = job.wait(timeout=60)
    assert (ended.id, ended.status, ended.exit_code, ended.name) == (job.id, "done", 0, "sdk-job")
    assert (ended.resources.cpus, ended.env) == (1, {"WHO": "me"})
    assert job.status == "done"
    assert sorted(job.logs()) == ["err", "out"]
    assert job.tasks == [job]
    assert [event.to for event in job.events()][-1] == "done"


def test_a_followed_job_gives_each_line_as_it_is_written(client: Client, tmp_path: Path):
    gate = tmp_path / "gate"
    job = client.submit(gated(gate, "first", "second"))
    lines = job.logs(follow=True)
    assert next(lines) == "first"  # the job is still waiting on the gate
    assert job.status == "running"
    gate.touch()
    assert list(lines) == ["second"]  # and the follow ends with the attempt
    assert job.wait(timeout=60).status == "done"


def test_a_wait_that_runs_out_says_where_the_job_stands(client: Client, tmp_path: Path):
    gate = tmp_path / "gate"
    job = client.submit(gated(gate, "up", "down"))
    assert next(job.logs(follow=True)) == "up"
    with pytest.raises(WaitTimeout) as waited:
        job.wait(timeout=0.3)
    assert isinstance(waited.value, TimeoutError)
    assert waited.value.status == "running" and waited.value.last.id == job.id
    assert f"job {job.id} has not ended after 0.3 s (status running" in str(waited.value)
    gate.touch()
    assert job.wait(timeout=60).status == "done"


def test_a_wait_on_a_job_no_worker_can_hold_says_so(client: Client):
    job = client.submit("true", gpus=64)
    with pytest.raises(WaitTimeout) as waited:
        job.wait(timeout=0.5)
    assert waited.value.status == "pending"
    assert "unschedulable" in str(waited.value), str(waited.value)
    assert job.cancel().status == "cancelled"


def test_a_running_job_is_cancelled(client: Client, tmp_path: Path):
    job = client.submit(gated(tmp_path / "never", "started", "never printed"))
    lines = job.logs(follow=True)
    assert next(lines) == "started"
    job.cancel()
    assert job.wait(timeout=60).status == "cancelled"
    assert list(lines) == []  # the follow ends with the stopped attempt
    with pytest.raises(ApiError) as again:
        job.cancel()
    assert (again.value.status, again.value.code) == (409, "already_terminal")


# --- a gang ----------------------------------------------------------------------------------


def test_a_gang_is_waited_for_and_its_ranks_output_merged(client: Client):
    gang = client.submit('echo "rank $RANK of $WORLD_SIZE"; echo bye', gang_size=2)
    assert isinstance(gang, GangHandle) and gang.id.startswith("g-")
    ranks = gang.tasks
    assert [task.refresh().gang_index for task in ranks] == [0, 1]
    ended = gang.wait(timeout=60)
    assert ended.status == "done" and [task.status for task in ended.tasks] == ["done", "done"]
    assert list(gang.logs()) == [
        "[rank 0] rank 0 of 2",
        "[rank 0] bye",
        "[rank 1] rank 1 of 2",
        "[rank 1] bye",
    ]
    assert [rank.wait(timeout=1).status for rank in ranks] == ["done", "done"]
    assert client.handle(gang.id) == gang and client.handle(gang.id).tasks == ranks


def test_a_followed_gang_gives_every_rank_s_lines_as_written(client: Client, tmp_path: Path):
    gate = tmp_path / "gate"
    gang = client.submit(gated(gate, "hello-from-$RANK", "bye-from-$RANK"), gang_size=2)
    lines = gang.logs(follow=True)
    assert sorted([next(lines), next(lines)]) == ["[rank 0] hello-from-0", "[rank 1] hello-from-1"]
    assert gang.status == "running"
    gate.touch()
    assert sorted(lines) == ["[rank 0] bye-from-0", "[rank 1] bye-from-1"]
    assert gang.wait(timeout=60).status == "done"


def test_a_running_gang_is_cancelled_whole(client: Client, tmp_path: Path):
    gang = client.submit(gated(tmp_path / "never", "up-$RANK", "never printed"), gang_size=2)
    lines = gang.logs(follow=True)
    assert sorted([next(lines), next(lines)]) == ["[rank 0] up-0", "[rank 1] up-1"]
    assert gang.cancel().gang_id == gang.id
    ended = gang.wait(timeout=60)
    assert ended.status == "cancelled" and {task.status for task in ended.tasks} == {"cancelled"}
    assert list(lines) == []


# --- an array --------------------------------------------------------------------------------


def test_an_array_is_waited_for_and_its_tasks_output_merged(client: Client):
    array = client.submit("echo index $CORRAL_ARRAY_INDEX of $CORRAL_ARRAY_SIZE", array="1,5,7%2")
    assert isinstance(array, ArrayHandle) and array.id.startswith("a-")
    tasks = array.tasks
    assert [task.refresh().array_index for task in tasks] == [1, 5, 7]
    assert array.wait(timeout=60).counts == {"done": 3}
    assert (array.status, array.counts) == ("done", {"done": 3})
    assert list(array.logs()) == [
        "[index 1] index 1 of 3",
        "[index 5] index 5 of 3",
        "[index 7] index 7 of 3",
    ]
    assert client.handle(array.id).tasks == tasks


def test_a_followed_array_gives_each_task_s_lines_and_ends_when_all_did(client: Client, tmp_path: Path):
    gate = tmp_path / "gate"
    array = client.submit(gated(gate, "start-$CORRAL_ARRAY_INDEX", "end-$CORRAL_ARRAY_INDEX"), array="0-1")
    lines = array.logs(follow=True)
    assert sorted([next(lines), next(lines)]) == ["[index 0] start-0", "[index 1] start-1"]
    gate.touch()
    assert sorted(lines) == ["[index 0] end-0", "[index 1] end-1"]
    assert array.wait(timeout=60).counts == {"done": 2}


def test_an_array_is_cancelled_running_and_waiting_tasks_alike(client: Client, tmp_path: Path):
    array = client.submit(gated(tmp_path / "never", "up", "never printed"), array="0-3%1")
    assert next(array.logs(follow=True)) == "[index 0] up"  # one runs, three wait their turn
    assert sorted(array.counts.items()) == [("pending", 3), ("running", 1)]
    array.cancel()
    assert array.wait(timeout=60).counts == {"cancelled": 4}
    assert array.status == "cancelled"


# --- the raw body, and mistakes --------------------------------------------------------------


def test_a_raw_body_is_sent_as_written_and_answered_as_the_server_said(client: Client):
    answer = client.submit_body({"command": "echo raw", "gang_size": 2, "resources": {"cpus": 1}})
    assert answer.gang_id.startswith("g-") and len(answer.tasks) == 2  # GangSubmitted
    gang = client.handle(answer)
    assert isinstance(gang, GangHandle) and [task.id for task in gang.tasks] == answer.tasks
    assert gang.wait(timeout=60).status == "done"
    assert list(gang.logs()) == ["[rank 0] raw", "[rank 1] raw"]


def test_submit_keywords_fill_resources_and_constraints(client: Client):
    job = client.submit(
        ["printf", "%s\\n", "two words"], gpus=0, cpus=2, memory_mb=64, labels={"zone": "a"}, priority=3
    )
    stored = job.refresh()
    assert stored.command == "printf '%s\\n' 'two words'"
    assert stored.resources.to_wire() == {"gpus": 0, "vram_mb": 0, "memory_mb": 64, "cpus": 2}
    assert (stored.constraints.labels, stored.priority) == ({"zone": "a"}, 3)
    job.cancel()  # no worker has the label


def test_mistakes_are_said_clearly(client: Client):
    with pytest.raises(TypeError, match="submit_body"):
        client.submit({"command": "true"})  # type: ignore[arg-type]
    with pytest.raises(ApiError) as refused:
        client.submit("true", gpus=-1)
    assert (refused.value.status, refused.value.code) == (400, "invalid_request")
    assert "gpus" in refused.value.message
    with pytest.raises(ApiError) as unknown:
        client.handle("j-nosuchjob").wait(timeout=5)
    assert (unknown.value.status, unknown.value.code) == (404, "not_found")


def test_the_user_facing_client_has_no_worker_protocol_calls():
    protocol = ("register_worker", "claim", "claim_many", "job_heartbeat", "done", "report_done", "fail")
    protocol += (
        "watchdog",
        "preempted",
        "upload_checkpoint",
        "append_log",
        "worker_heartbeat",
        "leave_worker",
    )
    assert [name for name in protocol if hasattr(Client, name)] == []
    assert [name for name in protocol if not hasattr(WorkerClient, name)] == []
    assert not hasattr(WorkerClient, "submit")
