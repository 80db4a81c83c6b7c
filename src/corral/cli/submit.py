"""``corral submit [flags] -- CMD ARGS...``: one flag per field of the submit body (``shared/API.md``).

Only the fields the user gave are sent, so the server's defaults stay the single source of defaults.
Values are not checked here beyond their type: the server validates and its ``invalid_request``
message (naming the field) is what the user sees, so the CLI can never drift from the contract.

It prints one id, the job's or (for a gang) the gang's, so ``ID=$(corral submit ...)`` works either
way: a gang id is taken wherever a job id is (``show``, ``logs``, ``events``, ``why``, ``cancel``),
and ``corral show G`` lists its tasks. Answers are read as plain JSON data (no pydantic: issue 23).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect, key_value
from corral.client import parse_after
from corral.domain.status import TERMINAL

if TYPE_CHECKING:
    from corral.client import Client

# (flag, body field, type, help) for the top-level scalar fields of the submit body.
_SCALAR_FIELDS: tuple[tuple[str, str, type, str], ...] = (
    ("--name", "name", str, "a name for people"),
    ("--gang-size", "gang_size", int, "tasks that must start together (>= 1; > 1 makes a gang)"),
    ("--pool", "pool", str, "fair-share pool path, e.g. team/project"),
    ("--priority", "priority", int, "order within a preemption class"),
    ("--preemption-class", "preemption_class", int, "0..10; 10 is never preempted"),
    (
        "--max-retries",
        "max_retries",
        int,
        "counted attempts the job gets (>= 0; 0 and 1 both mean one): a failed attempt is retried "
        "while counted attempts < this; runs refunded by a drain, preemption or watchdog do not count",
    ),
    ("--budget-s", "budget_s", float, "wall-clock budget in seconds (watchdog)"),
    (
        "--walltime-s",
        "walltime_s",
        float,
        "run-time limit in seconds: the worker ends the job at it (failed, walltime_exceeded)",
    ),
    ("--stall-timeout-s", "stall_timeout_s", float, "no-progress window in seconds (watchdog)"),
)
_RESOURCE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("--gpus", "gpus", "GPUs per task"),
    ("--vram-mb", "vram_mb", "VRAM per GPU in MB"),
    ("--memory-mb", "memory_mb", "memory per task in MB"),
    ("--cpus", "cpus", "CPUs per task"),
)
_FIRST_POLL_S = 0.2
_MAX_POLL_S = 2.0
#: ``--unschedulable-after``'s default (API.md "Lists and handles")
UNSCHEDULABLE_AFTER_S = 60.0


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "submit",
        parents=[parent],
        help="submit a job (or a gang)",
        description=(
            "Submit a job; with --gang-size > 1, a gang. A single CMD argument is run as is by /bin/sh -c "
            "(`corral submit 'echo a | wc -c'`); several are quoted and joined (`corral submit -- python "
            "train.py --lr 3e-4`). Unset flags take the server's defaults."
        ),
    )
    for flag, field, kind, help_text in _SCALAR_FIELDS:
        parser.add_argument(flag, dest=field, type=kind, help=help_text)
    for flag, field, help_text in _RESOURCE_FIELDS:
        parser.add_argument(flag, dest=field, type=int, help=help_text)
    parser.add_argument(
        "--env", type=key_value, action="append", metavar="K=V", help="environment (repeatable)"
    )
    parser.add_argument("--gpu-model", help="constraint: the worker's GPU model")
    parser.add_argument(
        "--label",
        type=key_value,
        action="append",
        metavar="K=V",
        help="constraint: a worker label (repeatable)",
    )
    parser.add_argument("--checkpoint", choices=("none", "auto", "manual"), help="checkpoint mode")
    user = os.environ.get("USER") or os.environ.get("LOGNAME")
    parser.add_argument("--user", default=user, help=f"who submits [default $USER: {user}]")
    place = parser.add_mutually_exclusive_group()
    place.add_argument(
        "--workdir", metavar="DIR", help="where the job starts on its worker [default: the current directory]"
    )
    place.add_argument(
        "--no-workdir", action="store_true", help="start the job in a fresh per-job directory instead"
    )
    parser.add_argument(
        "--array",
        metavar="SPEC",
        help="an array of this job: 0-99, 0-99:4 (every 4th) or 1,5,7, with %%N to run at most N at once",
    )
    parser.add_argument(
        "--after",
        metavar="WHEN:ID,...",
        help="start only once each job, gang or array ID ended as WHEN says: ok (every task done), "
        "notok, any; e.g. ok:a-1f2e,any:j-9c3d",
    )
    topology = parser.add_mutually_exclusive_group()
    topology.add_argument(
        "--topology-required",
        metavar="LEVEL",
        help="keep every rank inside one domain of this topology level (e.g. topology.rack), else wait",
    )
    topology.add_argument(
        "--topology-preferred",
        metavar="LEVEL",
        help="prefer one domain of this topology level, but do not wait for one",
    )
    parser.add_argument("--idempotency-key", help="a retried submit with the same key returns the first job")
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait until the job (every task) ends; exit 0 if done, else 1 (4: unschedulable, see below)",
    )
    parser.add_argument(
        "--unschedulable-after",
        type=_seconds,
        default=UNSCHEDULABLE_AFTER_S,
        metavar="SECONDS",
        help="with --wait: stop waiting (exit 4) once the job has been unschedulable, no registered "
        f"worker could ever hold it, for this long (default {UNSCHEDULABLE_AFTER_S:g})",
    )
    add_json_flag(parser)
    parser.add_argument("command", nargs="+", metavar="CMD", help="the command (put it after --)")
    parser.set_defaults(run=run)


def command_text(words: list[str]) -> str:
    """One word is already a shell command line; several are argv words, quoted for the shell."""
    return words[0] if len(words) == 1 else shlex.join(words)


def build_body(arguments: argparse.Namespace) -> dict[str, Any]:
    """The submit body holding only what the user gave (server defaults apply to the rest)."""
    body: dict[str, Any] = {"command": command_text(arguments.command)}
    for _, field, _, _ in _SCALAR_FIELDS:
        if getattr(arguments, field) is not None:
            body[field] = getattr(arguments, field)
    for name in ("checkpoint", "user"):
        if getattr(arguments, name):
            body[name] = getattr(arguments, name)
    if arguments.env:
        body["env"] = dict(arguments.env)
    resources = {field: getattr(arguments, field) for _, field, _ in _RESOURCE_FIELDS}
    resources = {field: value for field, value in resources.items() if value is not None}
    if resources:
        body["resources"] = resources
    constraints: dict[str, Any] = {}
    if arguments.gpu_model is not None:
        constraints["gpu_model"] = arguments.gpu_model
    if arguments.label:
        constraints["labels"] = dict(arguments.label)
    if constraints:
        body["constraints"] = constraints
    workdir = _workdir(arguments)
    if workdir is not None:
        body["workdir"] = workdir
    if getattr(arguments, "array", None):
        body["array"] = arguments.array
    if getattr(arguments, "after", None):
        body["after"] = [parse_after(part) for part in arguments.after.split(",") if part.strip()]
    if getattr(arguments, "topology_required", None):
        body["topology"] = {"required": arguments.topology_required}
    elif getattr(arguments, "topology_preferred", None):
        body["topology"] = {"preferred": arguments.topology_preferred}
    return body


def _workdir(arguments: argparse.Namespace) -> str | None:
    """``--workdir`` made absolute, else the current directory, unless ``--no-workdir`` (or the
    current directory is gone)."""
    if getattr(arguments, "no_workdir", False):
        return None
    given = getattr(arguments, "workdir", None)
    try:
        return os.path.abspath(given) if given else os.getcwd()
    except OSError:
        return None


def run(arguments: argparse.Namespace) -> int:
    headers = {"Idempotency-Key": arguments.idempotency_key} if arguments.idempotency_key else None
    with connect(arguments) as client:
        answer = client.request_json("POST", "/jobs", build_body(arguments), headers=headers)
        handle = submitted_id(answer)
        if not arguments.wait:
            if arguments.json:
                output.print_json(answer)
            else:
                print(handle)
            return exit_codes.OK
        if not arguments.json:
            print(handle, file=sys.stderr, flush=True)
        return _wait(client, handle, arguments.json, Unschedulable(arguments.unschedulable_after))


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


class Unschedulable:
    """How long the waited-for work has been ``unschedulable`` without a break, counted on this
    machine's clock from the first poll that saw it so (the server's reason follows the workers:
    a worker that registers and could hold it turns it back to ``queued``, and the count starts
    over)."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._since: float | None = None
        self.reason: dict[str, Any] | None = None

    def seen(self, tasks: list[dict[str, Any]]) -> bool:
        """Note this poll's tasks; True once they have been unschedulable for ``after_s``."""
        reasons = [
            task.get("reason")
            for task in tasks
            if task["status"] not in TERMINAL and (task.get("reason") or {}).get("code") == "unschedulable"
        ]
        if not reasons:
            self._since, self.reason = None, None
            return False
        self.reason = reasons[0]
        now = time.monotonic()
        if self._since is None:
            self._since = now
        return now - self._since >= self.after_s

    def give_up(self, handle: str, final: dict[str, Any], as_json: bool) -> int:
        """Say why the wait ends (the work itself stays queued) and exit 4. Standard output names
        the work and its status as a finished wait does (``ID: STATUS``), so a script that reads
        the id from it has one either way."""
        if as_json:
            output.print_json(final)
        else:
            status = final.get("status") or output.counts_text(final.get("counts", {}))
            print(f"{handle}: {status}")
        print(
            f"corral: {handle} has been {output.reason_text(self.reason)} for {self.after_s:g} s or more; "
            f"not waiting for ever (it stays queued: `corral cancel {handle}` removes it)",
            file=sys.stderr,
        )
        return exit_codes.UNSCHEDULABLE


def submitted_id(answer: dict[str, Any]) -> str:
    """The id a submit answered: an array's ``array_id`` (``{array_id, tasks}``), a gang's
    ``gang_id`` (``{gang_id, tasks}``), else the job's."""
    if "command" not in answer and "array_id" in answer:
        return str(answer["array_id"])
    if "command" not in answer and "gang_id" in answer:
        return str(answer["gang_id"])
    return str(answer["id"])


def _wait(client: Client, handle: str, as_json: bool, unschedulable: Unschedulable) -> int:
    """Poll (backing off to every 2 s) until every task is terminal; print the outcome. Work that
    stays ``unschedulable`` for ``unschedulable.after_s`` ends the wait with exit 4."""
    if handle.startswith("a-"):
        return _wait_array(client, handle, as_json, unschedulable)
    delay = _FIRST_POLL_S
    gang = handle.startswith("g-")
    while True:
        final: dict[str, Any] = client.request_json("GET", f"/gangs/{handle}" if gang else f"/jobs/{handle}")
        tasks: list[dict[str, Any]] = final["tasks"] if gang else [final]
        if all(task["status"] in TERMINAL for task in tasks):
            break
        if unschedulable.seen(tasks):
            return unschedulable.give_up(handle, final, as_json)
        time.sleep(delay)
        delay = min(delay * 1.5, _MAX_POLL_S)
    if as_json:
        output.print_json(final)
    else:
        if gang:
            print(f"{handle}: {final['status']}")
        for task in tasks:
            print(f"{task['id']}: {_outcome(task)}")
    succeeded = all(task["status"] == "done" for task in tasks)
    return exit_codes.OK if succeeded else exit_codes.REFUSED


def _wait_array(client: Client, array_id: str, as_json: bool, unschedulable: Unschedulable) -> int:
    """``--wait`` for an array: until every task ended; its counts by status, then the outcome.
    Its tasks share one request, so the first task not ended tells whether they are unschedulable."""
    delay = _FIRST_POLL_S
    while True:
        final: dict[str, Any] = client.request_json("GET", f"/arrays/{array_id}", params={"limit": 0})
        counts: dict[str, int] = final["counts"]
        if all(status in TERMINAL for status in counts):
            break
        if counts.get("pending"):
            waiting = client.request_json(
                "GET", "/jobs", params={"array_id": array_id, "status": "pending", "limit": 1}
            )
            if unschedulable.seen(waiting["items"]):
                return unschedulable.give_up(array_id, final, as_json)
        time.sleep(delay)
        delay = min(delay * 1.5, _MAX_POLL_S)
    if as_json:
        output.print_json(final)
    else:
        print(f"{array_id}: {output.counts_text(counts)}")
    succeeded = set(counts) == {"done"}
    return exit_codes.OK if succeeded else exit_codes.REFUSED


def _outcome(job: dict[str, Any]) -> str:
    """``done``, or ``failed (exit 3): <error>`` / ``cancelled: <reason>`` so the why is on one line."""
    text: str = job["status"]
    if job.get("exit_code") is not None and job["status"] != "done":
        text += f" (exit {job['exit_code']})"
    reason = job.get("reason")
    detail = job.get("error") or (reason["message"] if reason else None)
    if detail and job["status"] != "done":
        text += f": {output.truncate(detail, 200)}"
    return text
