"""The CLI in-process (``corral.cli.main.main``) against a live server, on SQLite and PostgreSQL.

What is checked is what a user or a script sees: stdout, stderr and the exit code; what the server
stored is read back through the SDK, never through the store.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

from corral.cli import jobs, pools
from corral.cli.main import main
from corral.client import Client
from corral.protocol.answers import WorkerAnswer, WorkerPage
from corral.worker.calls import WorkerClient
from tests.helpers import corral


def corral_json(server: Any, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    command, *rest = argv
    code, out, err = corral(server, capsys, command, "--json", *rest)
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def client(server: Any) -> Any:
    with Client(server.url) as sdk:
        yield sdk


@pytest.fixture
def worker(server: Any) -> Any:
    """The worker's side of the protocol (register, claim, reports), played by the test."""
    with WorkerClient(server.url) as protocol:
        yield protocol


def test_submit_sends_every_flag(server, client, capsys):
    code, out, err = corral(
        server, capsys, "submit",
        "--name", "train", "--env", "A=1", "--env", "B=x=y", "--gpus", "2", "--vram-mb", "1000",
        "--memory-mb", "2048", "--cpus", "4", "--gpu-model", "H100", "--label", "zone=a",
        "--label", "rack=7", "--pool", "team/x", "--priority", "7", "--preemption-class", "3",
        "--checkpoint", "auto", "--max-retries", "1", "--budget-s", "100", "--walltime-s", "50.5",
        "--stall-timeout-s", "30", "--user", "alice",
        "--", "python", "train.py", "--lr", "3e-4", "--note", "two words",
    )  # fmt: skip
    assert code == 0, err
    job_id = out.strip()
    assert job_id.startswith("j-")
    job = client.get_job(job_id)
    assert job["command"] == "python train.py --lr 3e-4 --note 'two words'"
    assert job["name"] == "train"
    assert job["env"] == {"A": "1", "B": "x=y"}
    assert job.resources.to_wire() == {"gpus": 2, "vram_mb": 1000, "memory_mb": 2048, "cpus": 4}
    assert job["constraints"]["gpu_model"] == "H100"
    assert job["constraints"]["labels"] == {"zone": "a", "rack": "7"}
    assert (job["pool"], job["priority"], job["preemption_class"]) == ("team/x", 7, 3)
    assert (job["checkpoint_mode"], job["max_retries"], job["user"]) == ("auto", 1, "alice")
    assert (job["budget_s"], job["walltime_s"], job["stall_timeout_s"]) == (100, 50.5, 30)


def test_submit_single_argument_is_a_shell_line_and_defaults_come_from_the_server(
    server, client, capsys, monkeypatch
):
    monkeypatch.delenv("USER", raising=False)
    monkeypatch.delenv("LOGNAME", raising=False)
    code, out, _ = corral(server, capsys, "submit", "echo a | wc -c")
    assert code == 0
    job = client.get_job(out.strip())
    assert job["command"] == "echo a | wc -c"
    assert job.resources.to_wire() == {"gpus": 0, "vram_mb": 0, "memory_mb": 0, "cpus": 0}
    assert (job["pool"], job["preemption_class"], job["checkpoint_mode"], job["max_retries"]) == (
        "default",
        5,
        "none",
        3,
    )


def test_submit_user_defaults_to_the_login(server, client, capsys, monkeypatch):
    monkeypatch.setenv("USER", "bob")
    code, out, _ = corral(server, capsys, "submit", "--", "true")
    assert code == 0
    assert client.get_job(out.strip())["user"] == "bob"


def test_submit_json_and_gang(server, client, capsys):
    answer = corral_json(server, capsys, "submit", "--name", "one", "--", "true")
    assert answer["status"] == "pending" and answer["name"] == "one"

    code, out, _ = corral(server, capsys, "submit", "--gang-size", "3", "--", "hostname")
    assert code == 0
    (gang_id,) = out.split()  # one id, so `G=$(corral submit ...)` holds the gang's
    assert gang_id.startswith("g-") and len(client.gang(gang_id)["tasks"]) == 3

    answer = corral_json(server, capsys, "submit", "--gang-size", "2", "--", "hostname")
    assert answer["gang_id"].startswith("g-") and len(answer["tasks"]) == 2


def test_submit_idempotency_key_returns_the_first_job(server, capsys):
    first = corral(server, capsys, "submit", "--idempotency-key", "k1", "--", "true")
    second = corral(server, capsys, "submit", "--idempotency-key", "k1", "--", "true")
    assert first[0] == second[0] == 0
    assert first[1] == second[1]


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--preemption-class", "11"], "preemption_class"),
        (["--gpus", "-1"], "resources.gpus"),
        (["--gang-size", "0"], "gang_size"),
        (["--pool", "bad pool!"], "pool"),
    ],
)
def test_submit_refused_by_the_server_exits_1_naming_the_field(server, capsys, flags, field):
    code, out, err = corral(server, capsys, "submit", *flags, "--", "true")
    assert code == 1
    assert out == ""
    assert err.startswith("corral: invalid_request: ")
    assert field in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "--checkpoint", "sometimes", "--", "true"],
        ["submit", "--env", "novalue", "--", "true"],
        ["submit", "--gpus", "two", "--", "true"],
        ["submit"],
        ["jobs", "--limit", "many"],
        ["nonsense"],
        [],
    ],
)
def test_usage_errors_exit_2(server, capsys, argv):
    assert main([argv[0], "--server", server.url, *argv[1:]] if argv else []) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_help_documents_the_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for line in ("0  success", "1  the server refused", "2  usage error", "3  the server is unreachable"):
        assert line in out


@pytest.mark.parametrize("command", ["show", "events", "why", "cancel"])
def test_unknown_job_exits_1_not_found(server, capsys, command):
    code, _, err = corral(server, capsys, command, "j-doesnotexist")
    assert code == 1
    assert err.strip() == "corral: not_found: job j-doesnotexist not found"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("argv", [["jobs"], ["submit", "--", "true"], ["workers"], ["show", "j-1"]])
def test_unreachable_server_exits_3(capsys, argv):
    url = f"http://127.0.0.1:{_closed_port()}"
    assert main([argv[0], "--server", url, *argv[1:]]) == 3
    err = capsys.readouterr().err
    assert url in err and "corral up" in err
    assert "Traceback" not in err


def test_server_flag_before_the_command_and_from_the_environment(server, capsys, monkeypatch):
    assert main(["--server", server.url, "jobs"]) == 0
    monkeypatch.setenv("CORRAL_SERVER", server.url)
    assert main(["jobs"]) == 0
    monkeypatch.setenv("CORRAL_SERVER", f"http://127.0.0.1:{_closed_port()}")
    assert main(["jobs"]) == 3
    assert main(["jobs", "--server", server.url]) == 0


def test_jobs_table_filters_and_json(server, client, clock, capsys):
    first = client.submit_body(
        {"command": "python train.py", "name": "trainer", "resources": {"gpus": 2}, "user": "alice"}
    )
    clock.advance(1)  # the API orders by submission time, then id
    second = client.submit_body({"command": "echo " + "x" * 100, "pool": "team/a"})
    code, out, _ = corral(server, capsys, "jobs")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == list(jobs.HEADERS)
    assert [row.split()[0] for row in rows] == [second["id"], first["id"]]  # newest first
    assert rows[1].split()[1:5] == ["pending", "alice", "0", "2"]
    assert "trainer" in rows[1]
    assert "x" * 100 not in rows[0] and "…" in rows[0]

    code, out, _ = corral(server, capsys, "jobs", "--pool", "team/a")
    assert [row.split()[0] for row in out.splitlines()[1:]] == [second["id"]]
    code, out, _ = corral(server, capsys, "jobs", "--oldest")
    assert [row.split()[0] for row in out.splitlines()[1:]] == [first["id"], second["id"]]

    page = corral_json(server, capsys, "jobs", "--status", "pending,running")
    assert [job["id"] for job in page["items"]] == [second["id"], first["id"]]
    assert page["next"] is None
    assert corral_json(server, capsys, "jobs", "--status", "done")["items"] == []

    code, _, err = corral(server, capsys, "jobs", "--status", "sleeping")
    assert code == 1 and err.startswith("corral: invalid_request:")


def test_jobs_shows_what_has_not_ended_unless_all(server, client, worker, clock, capsys):
    worker.register_worker({"id": "w1", "resources": {"cpus": 2}})
    ended = client.submit_body({"command": "true"})
    worker.done(ended["id"], "w1", worker.claim("w1")["attempt"])
    clock.advance(1)
    cancelled = client.submit_body({"command": "true"})
    client.cancel(cancelled["id"])
    clock.advance(1)
    running = client.submit_body({"command": "sleep 9"})
    assert worker.claim("w1")["id"] == running["id"]
    clock.advance(1)
    waiting = client.submit_body({"command": "true"})
    gang = client.submit_body({"command": "hostname", "gang_size": 2})
    active = [job["id"] for job in corral_json(server, capsys, "jobs")["items"]]
    assert set(active) == {running["id"], waiting["id"], *gang["tasks"]}
    assert active[-1] == running["id"]
    every = [job["id"] for job in corral_json(server, capsys, "jobs", "--all")["items"]]
    assert every[-3:] == [running["id"], cancelled["id"], ended["id"]] and len(every) == 6
    # `pending` names a waiting gang's tasks too (they wait as `blocked`)
    pending = corral_json(server, capsys, "jobs", "--status", "pending")["items"]
    assert {job["id"] for job in pending} == {waiting["id"], *gang["tasks"]}
    assert {job["status"] for job in pending} == {"pending", "blocked"}


def test_jobs_of_a_user_and_mine(server, client, capsys, monkeypatch):
    alice = client.submit_body({"command": "true", "user": "alice"})
    bob = client.submit_body({"command": "true", "user": "bob"})
    assert [job["id"] for job in corral_json(server, capsys, "jobs", "--user", "alice")["items"]] == [
        alice["id"]
    ]
    monkeypatch.setenv("USER", "bob")
    assert [job["id"] for job in corral_json(server, capsys, "jobs", "--mine")["items"]] == [bob["id"]]
    code, _, err = corral(server, capsys, "jobs", "--mine", "--user", "alice")
    assert code == 2 and "not allowed with" in err


def test_jobs_limit_and_all_follow_the_cursor(server, client, clock, capsys):
    submitted = []
    for index in range(7):
        submitted.append(client.submit_body({"command": f"echo {index}"})["id"])
        clock.advance(1)
    newest = submitted[::-1]
    code, out, err = corral(server, capsys, "jobs", "--limit", "3")
    assert code == 0
    assert [row.split()[0] for row in out.splitlines()[1:]] == newest[:3]
    assert "--all" in err
    page = corral_json(server, capsys, "jobs", "--limit", "3")
    assert len(page["items"]) == 3 and page["next"]
    everything = corral_json(server, capsys, "jobs", "--all")
    assert [job["id"] for job in everything["items"]] == newest
    code, out, _ = corral(server, capsys, "jobs", "--all")
    assert len(out.splitlines()) == 1 + len(submitted)


def test_jobs_gang_and_worker_filters(server, client, worker, capsys):
    gang = client.submit_body({"command": "hostname", "gang_size": 2})
    client.submit_body({"command": "true"})
    page = corral_json(server, capsys, "jobs", "--gang", gang["gang_id"])
    assert sorted(job["id"] for job in page["items"]) == sorted(gang["tasks"])
    worker.register_worker({"id": "w1", "resources": {"cpus": 2}})
    claimed = worker.claim("w1")
    page = corral_json(server, capsys, "jobs", "--worker", "w1")
    assert [job["id"] for job in page["items"]] == [claimed["id"]]


def test_jobs_start_shows_the_estimated_start_of_waiting_jobs(server, client, worker, clock, capsys):
    """``corral jobs --start`` (like ``squeue --start``): a gang planned at a running job's limit."""
    for worker_id in ("w1", "w2"):
        worker.register_worker({"id": worker_id, "resources": {"gpus": 2, "vram_mb": 1000}})
    limited = client.submit_body({"command": "sleep 9", "resources": {"gpus": 2}, "walltime_s": 30})
    running = worker.claim("w1")
    assert running["id"] == limited["id"]
    gang = client.submit_body({"command": "train", "gang_size": 2, "resources": {"gpus": 2}})
    endless = client.submit_body({"command": "true", "resources": {"gpus": 4}})  # no worker holds it
    server.run_loop("admission")
    code, out, _ = corral(server, capsys, "jobs", "--start")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split("  ")[0] == "ID" and "ESTIMATED START" in header and "PLANNED WORKERS" in header
    by_id = {line.split()[0]: line for line in rows}
    assert set(by_id) == {*gang["tasks"], endless["id"]}, "only the waiting jobs"
    start = running["deadline_at"].replace("T", " ").split(".")[0]
    assert start in by_id[gang["tasks"][0]] and "w1,w2" in by_id[gang["tasks"][0]]
    assert start not in by_id[endless["id"]]


def test_show_events_why(server, client, worker, capsys):
    job = client.submit_body(
        {"command": "sleep 1", "name": "nap", "env": {"K": "V"}, "resources": {"cpus": 1}}
    )
    code, out, _ = corral(server, capsys, "show", job["id"])
    assert code == 0
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert fields["id"].strip() == job["id"]
    assert fields["status"].strip() == "pending"
    assert fields["resources"].strip() == "gpus=0 vram_mb=0 memory_mb=0 cpus=1"
    assert fields["env"].strip() == "K=V"
    assert set(client.get_job(job["id"]).to_wire()) <= set(fields)
    assert corral_json(server, capsys, "show", job["id"]) == client.get_job(job["id"]).to_wire()

    code, out, _ = corral(server, capsys, "why", job["id"])
    assert code == 0
    assert out.splitlines()[0] == f"{job['id']}: pending"
    assert out.splitlines()[1].strip().startswith("no_workers: ")
    answer = corral_json(server, capsys, "why", job["id"])
    assert answer["status"] == "pending" and answer["reasons"][0]["code"] == "no_workers"

    worker.register_worker({"id": "w1", "resources": {"cpus": 2}})
    claimed = worker.claim("w1")
    worker.done(job["id"], "w1", claimed["attempt"])
    code, out, _ = corral(server, capsys, "events", job["id"])
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["AT", "FROM", "TO", "REASON", "WORKER", "ATTEMPT", "EPOCH"]
    assert [row.split()[3] for row in rows] == ["pending", "running", "done"]  # AT is two words
    assert "w1" in rows[1]
    events = corral_json(server, capsys, "events", job["id"])["items"]
    assert [event["to"] for event in events] == ["pending", "running", "done"]


def test_show_a_gang(server, client, capsys):
    gang = client.submit_body({"command": "hostname", "gang_size": 2})
    code, out, _ = corral(server, capsys, "show", gang["gang_id"])
    assert code == 0
    assert f"gang_id: {gang['gang_id']}" in out and "status: blocked" in out
    assert all(task in out for task in gang["tasks"])
    assert corral_json(server, capsys, "show", gang["gang_id"])["size"] == 2


def test_cancel(server, client, capsys):
    first = client.submit_body({"command": "true"})["id"]
    second = client.submit_body({"command": "true"})["id"]
    code, out, _ = corral(server, capsys, "cancel", first, second)
    assert code == 0
    assert out.splitlines() == [f"{first}: cancelled", f"{second}: cancelled"]
    assert client.get_job(first)["status"] == "cancelled"

    third = client.submit_body({"command": "true"})["id"]
    code, out, err = corral(server, capsys, "cancel", first, third)
    assert code == 1
    assert err.startswith("corral: already_terminal: ")
    assert out.strip() == f"{third}: cancelled"

    gang = client.submit_body({"command": "hostname", "gang_size": 2})
    code, out, _ = corral(server, capsys, "cancel", gang["gang_id"])
    assert code == 0 and out.strip() == f"{gang['gang_id']}: cancelled (2 tasks)"
    assert {task["status"] for task in client.gang(gang["gang_id"])["tasks"]} == {"cancelled"}


def test_cancel_of_a_running_job_says_it_is_being_stopped(server, client, worker, capsys):
    worker.register_worker({"id": "w1", "resources": {"cpus": 2}})
    job = client.submit_body({"command": "sleep 60"})["id"]
    assert worker.claim("w1")["id"] == job
    code, out, _ = corral(server, capsys, "cancel", job)
    assert code == 0
    assert out.strip() == f"{job}: cancelling: stopping it on w1; it ends cancelled once it has stopped"
    assert "preempting" not in out


def test_a_gang_id_is_taken_wherever_a_job_id_is(server, client, capsys):
    code, out, _ = corral(server, capsys, "submit", "--gang-size", "2", "--gpus", "8", "--", "hostname")
    assert code == 0
    gang_id = out.strip()
    tasks = [task["id"] for task in client.gang(gang_id)["tasks"]]

    code, out, _ = corral(server, capsys, "show", gang_id)
    assert code == 0 and "status: blocked" in out and all(task in out for task in tasks)

    code, out, _ = corral(server, capsys, "why", gang_id)
    assert code == 0
    assert out.splitlines()[0] == f"{gang_id}: blocked (reasons of task {tasks[0]})"
    assert corral_json(server, capsys, "why", gang_id)["gang_id"] == gang_id

    code, out, _ = corral(server, capsys, "events", gang_id)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["JOB", "AT", "FROM"]
    told = [(row.split()[0], row.split()[4]) for row in rows]  # AT is two words
    assert told == [(tasks[0], "blocked"), (tasks[1], "blocked")]

    code, out, _ = corral(server, capsys, "logs", gang_id)
    assert code == 0 and out == ""  # nothing ran yet

    code, out, _ = corral(server, capsys, "cancel", gang_id)
    assert code == 0 and out.strip() == f"{gang_id}: cancelled (2 tasks)"
    code, out, _ = corral(server, capsys, "events", gang_id)
    assert [row.split()[4] for row in out.splitlines()[1:]][-2:] == ["cancelled", "cancelled"]


def test_workers_remove(server, client, worker, capsys):
    worker.register_worker({"id": "w1", "resources": {"cpus": 2}})
    code, _, err = corral(server, capsys, "workers", "remove", "w1")
    assert code == 1 and err.startswith("corral: conflict: worker w1 is active")
    worker.leave_worker("w1")
    code, out, _ = corral(server, capsys, "workers", "remove", "w1")
    assert code == 0 and out.strip() == "w1 removed"
    assert client.workers() == []
    code, _, err = corral(server, capsys, "workers", "remove", "w1")
    assert code == 1 and err.startswith("corral: not_found:")


def test_workers(server, client, worker, capsys):
    worker.register_worker(
        {"id": "w1", "resources": {"gpus": 4, "vram_mb": 80000, "memory_mb": 64000, "cpus": 16}}
    )
    worker.register_worker(
        {"id": "w2", "resources": {"cpus": 2}, "enforcement": {"identity": "setuid", "memory": "cgroup_v1"}}
    )
    job = client.submit_body({"command": "train", "resources": {"gpus": 2, "cpus": 4, "memory_mb": 1000}})
    assert worker.claim("w1")["id"] == job["id"]
    readings = [{"index": index, "util_pct": util} for index, util in enumerate((87.4, 90, 0, 0))]
    worker.worker_heartbeat("w1", {"gpus": readings})
    code, out, _ = corral(server, capsys, "workers")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == [
        "ID", "STATUS", "GPUS", "GPU-UTIL", "CPUS", "MEM", "LAST-HEARTBEAT", "RUNNING", "ENFORCEMENT",
    ]  # fmt: skip
    by_id = {row.split()[0]: row.split() for row in rows}
    assert by_id["w1"][1:6] == ["active", "2/4", "87,90,0,0%", "4/16", "1000/64000"]
    assert by_id["w1"][-2:] == ["1", "-"]  # a worker that never said what it enforces
    assert by_id["w2"][-1] == "identity=setuid,memory=cgroup_v1"
    assert by_id["w2"][1:6] == ["active", "0/0", "-", "0/2", "0/0"]
    items = corral_json(server, capsys, "workers")["items"]
    assert {worker["id"] for worker in items} == {"w1", "w2"}
    assert corral_json(server, capsys, "workers", "--dead")["items"] == []


def test_workers_dead_lists_only_flagged_workers(capsys, monkeypatch):
    """The flag is set by the server's dead-worker sweep; here the SDK answer is scripted."""
    workers = [
        _worker("alive", flagged_dead_at=None),
        _worker("gone", flagged_dead_at="2024-01-01T00:00:00.000Z"),
    ]
    monkeypatch.setattr(
        Client,
        "worker_page",
        lambda self: WorkerPage(items=[WorkerAnswer.model_validate(each) for each in workers]),
    )
    assert main(["workers", "--dead"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[:3] for row in rows] == [["gone", "offline", "(dead)"]]


def _worker(worker_id: str, flagged_dead_at: str | None) -> dict[str, Any]:
    nothing = {"gpus": 0, "vram_mb": 0, "memory_mb": 0, "cpus": 0}
    return {
        "id": worker_id,
        "status": "offline" if flagged_dead_at else "active",
        "resources": nothing,
        "used": nothing,
        "last_heartbeat_at": None,
        "registered_at": "2024-01-01T00:00:00.000Z",
        "flagged_dead_at": flagged_dead_at,
        "running": [],
    }


def _finish_when_submitted(server: Any, outcome: str) -> threading.Thread:
    """Play the worker for ``submit --wait``: claim the job once it exists, then finish it."""

    def play() -> None:
        with WorkerClient(server.url) as worker:
            worker.register_worker({"id": "w1", "resources": {"cpus": 2}})
            deadline = time.monotonic() + 10
            claimed = None
            while claimed is None and time.monotonic() < deadline:
                claimed = worker.claim("w1")
                time.sleep(0.05)
            assert claimed is not None
            if outcome == "done":
                worker.done(claimed["id"], "w1", claimed["attempt"])
            else:
                worker.fail(claimed["id"], "w1", claimed["attempt"], exit_code=3, error="boom")

    thread = threading.Thread(target=play)
    thread.start()
    return thread


@pytest.mark.parametrize(("outcome", "code"), [("done", 0), ("failed", 1)])
def test_submit_wait_exits_by_the_outcome(server, capsys, outcome, code):
    worker = _finish_when_submitted(server, outcome)
    result = corral(server, capsys, "submit", "--wait", "--max-retries", "0", "--", "true")
    worker.join()
    assert result[0] == code
    job_id = result[2].strip()
    assert result[1].startswith(f"{job_id}: {outcome}")
    if outcome == "failed":
        assert "exit 3" in result[1] and "boom" in result[1]


def test_submit_wait_json_prints_the_final_job(server, capsys):
    worker = _finish_when_submitted(server, "done")
    final = corral_json(server, capsys, "submit", "--wait", "--", "true")
    worker.join()
    assert final["status"] == "done"


def test_submit_wait_on_a_cancelled_gang_exits_1(server, client, capsys):
    def cancel_the_gang() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            gangs = {job["gang_id"] for job in client.list_jobs_page()["items"] if job["gang_id"]}
            if gangs:
                client.cancel_gang(gangs.pop())
                return
            time.sleep(0.05)

    canceller = threading.Thread(target=cancel_the_gang)
    canceller.start()
    code, out, _ = corral(server, capsys, "submit", "--wait", "--gang-size", "2", "--", "hostname")
    canceller.join()
    assert code == 1
    lines = out.splitlines()
    assert lines[0].endswith(": cancelled") and lines[0].startswith("g-")
    assert len(lines) == 3 and all("cancelled" in line for line in lines[1:])


def test_pools_prints_the_tree_and_json(server, client, worker, capsys):
    client.put_pool(
        "team/x", {"weight": 2, "guarantee": {"gpus": 8}, "limits": {"gpus": 16}, "kind": "training"}
    )
    client.submit_body({"command": "true", "pool": "team/x/y", "resources": {"gpus": 3}})
    worker.register_worker({"id": "w1", "resources": {"gpus": 8, "memory_mb": 64000, "cpus": 32}})
    code, out, err = corral(server, capsys, "pools")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == list(pools.HEADERS)
    assert [row.split() for row in rows] == [
        ["default", "batch", "1", "0", "-", "0", "0", "0.0", "-", "-", "0"],
        ["team", "batch", "1", "0", "-", "0", "3", "3.0", "0.00", "-", "1"],
        ["x", "training", "2", "8", "16", "0", "3", "3.0", "0.00", "-", "1"],
        ["y", "training", "1", "0", "-", "0", "3", "3.0", "0.00", "-", "1"],
    ]
    assert rows[2].startswith("  x") and rows[3].startswith("    y")
    page = corral_json(server, capsys, "pools")
    assert [item["path"] for item in page["items"]] == ["default", "team", "team/x", "team/x/y"]
    assert page["items"][2]["limits"] == {"gpus": 16, "vram_mb": None, "memory_mb": None, "cpus": None}


def test_pools_set_changes_only_what_it_is_given_and_delete_removes(server, client, capsys):
    code, out, err = corral(
        server, capsys, "pools", "set", "lab/a", "--weight", "2", "--guarantee-gpus", "8",
        "--limit-gpus", "16", "--kind", "training", "--starvation-timeout-s", "20",
        "--no-aggressive-preemption", "--max-walltime-s", "7200",
    )  # fmt: skip
    assert code == 0, err
    assert out.split()[len(pools.HEADERS) :][:5] == ["a", "training", "2", "8", "16"]
    pool = corral_json(server, capsys, "pools", "set", "lab/a", "--limit-cpus", "4", "--inherit", "kind")
    assert pool["settings"] == {
        "weight": 2.0, "guarantee": {"gpus": 8, "vram_mb": 0, "memory_mb": 0, "cpus": 0},
        "limits": {"gpus": 16, "vram_mb": None, "memory_mb": None, "cpus": 4}, "mode": None, "kind": None,
        "starvation_timeout_s": 20.0, "aggressive_starvation_timeout_s": None, "starvation_tolerance": None,
        "enable_aggressive_starvation": None, "allow_aggressive_preemption": False,
        "default_walltime_s": None, "max_walltime_s": 7200.0,
    }  # fmt: skip
    assert client.pool("lab/a").kind == "batch"

    code, _, err = corral(server, capsys, "pools", "set", "lab/a", "--weight", "0")
    assert code == 1 and err.startswith("corral: invalid_request: weight:")
    code, _, err = corral(server, capsys, "pools", "set", "lab/a", "--kind", "secret")
    assert code == 2
    code, _, err = corral(server, capsys, "pools", "delete", "lab")
    assert code == 1 and err.startswith("corral: conflict:")
    assert corral(server, capsys, "pools", "delete", "lab/a")[0] == 0
    assert [pool.path for pool in client.pools()] == ["default", "lab"]
    code, _, err = corral(server, capsys, "pools", "delete", "nope")
    assert code == 1 and err.startswith("corral: not_found:")


def test_submit_pool_reaches_the_pool(server, client, capsys):
    code, out, err = corral(server, capsys, "submit", "--pool", "research/nlp", "--", "true")
    assert code == 0, err
    job = client.get_job(out.strip())
    assert job.pool == "research/nlp"
    assert job.reason.message.endswith("pool 'research/nlp' created with defaults")
    assert client.pool("research/nlp").jobs == 1


def test_jobs_and_submit_against_a_server_load_no_model(server, client):
    """In a fresh interpreter, a submit and the list that shows it: pydantic, the wire models and
    the core stay unloaded all the way (issue 23: the start-up they cost)."""
    from tests.unit.test_cli_startup import heavy_modules_after

    body = (
        "import contextlib, io\n"
        "from corral.cli.main import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    assert main(['submit', '--server', {server.url!r}, '--name', 'probe', '--', 'true']) == 0\n"
        f"    assert main(['jobs', '--server', {server.url!r}]) == 0\n"
        "assert 'probe' in out.getvalue(), out.getvalue()\n"
    )
    assert heavy_modules_after(body) == []
    assert [job["name"] for job in client.iter_jobs()] == ["probe"]
