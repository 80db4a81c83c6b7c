"""The README's shell blocks marked runnable, run as a reader would run them (issue 23 item 8: its
examples had drifted from what corral does).

A block is runnable when the line before its opening fence is ``<!-- runnable -->`` (run against a
fresh ``corral up``), ``<!-- runnable: FLAGS -->`` (``corral up FLAGS``, e.g. ``--workers 3 --gpus
4``) or ``<!-- runnable: no server -->``. Each block runs under ``bash -euo pipefail`` in a scratch
directory (holding ``examples/``), with a ``corral`` on the PATH that is this checkout's CLI and
``CORRAL_SERVER`` set to its ``corral up``: every command must exit 0, so a command that changed or
an output a ``$(...)`` no longer captures fails the test. Blocks that share a setup share one
``corral up``, started with the README's own defaults (no ``--gpus``: where NVML finds no GPU, as
in CI, its worker offers fake ones, as the Quick start says).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = re.compile(r"^<!-- runnable(?::\s*(?P<setup>.*?))?\s*-->$")
NO_SERVER = "no server"
UP_TIMEOUT_S = 30.0
BLOCK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    setup: str  # flags for `corral up`, or NO_SERVER
    code: str


def runnable_blocks(text: str) -> list[Block]:
    """Every block the README marks runnable, in order; a marker not followed by a ``sh`` block
    is an error (a marker that silently ran nothing would hide the drift it is there to catch)."""
    lines = text.splitlines()
    blocks = []
    for index, line in enumerate(lines):
        match = MARKER.match(line.strip())
        if match is None:
            continue
        fence = index + 1
        if fence >= len(lines) or lines[fence].strip() != "```sh":
            raise AssertionError(
                f"README.md:{index + 1}: a runnable marker must be followed by a ```sh block"
            )
        end = next((at for at in range(fence + 1, len(lines)) if lines[at].strip() == "```"), None)
        if end is None:
            raise AssertionError(f"README.md:{fence + 1}: the block is never closed")
        code = "\n".join(lines[fence + 1 : end]) + "\n"
        blocks.append(Block(fence + 1, (match.group("setup") or "").strip(), code))
    return blocks


def test_the_markers_find_the_blocks_the_readme_promises() -> None:
    blocks = runnable_blocks(README.read_text())
    setups = {block.setup for block in blocks}
    assert len(blocks) >= 3 and {"", NO_SERVER} <= setups
    assert any("corral sim examples/sim/" in block.code for block in blocks)
    with pytest.raises(AssertionError, match="a runnable marker must be followed"):
        runnable_blocks("<!-- runnable -->\ntext\n")


OPERATORS = {";", "&&", "||", "|", "&", "(", ")", ">", ">>", "<", "2>", "$("}


def corral_commands(text: str) -> list[list[str]]:
    """The arguments of every ``corral`` command in the README's shell blocks, runnable or not
    (``corral server`` and ``corral worker`` have parsers of their own and are left out)."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
            lexer.whitespace_split = True
            try:
                words = list(lexer)
            except ValueError:  # a quote the shell itself would refuse: not a command line
                continue
            for index, word in enumerate(words):
                if word != "corral" and not word.endswith("=$corral"):
                    continue
                rest = []
                for argument in words[index + 1 :]:
                    if argument in OPERATORS or set(argument) <= set(";&|()<>"):
                        break
                    rest.append(argument)
                if rest and rest[0] not in ("server", "worker"):
                    commands.append(rest)
    return commands


def test_every_corral_command_in_the_readme_parses(capsys: pytest.CaptureFixture[str]) -> None:
    """Every ``corral ...`` line of every shell block, runnable or not, is one the CLI accepts:
    a renamed command or flag fails here even where the block cannot run (a real cluster)."""
    from corral.cli.main import build_parser, chosen_command

    commands = corral_commands(README.read_text())
    assert len(commands) >= 40
    refused = []
    for arguments in commands:
        try:
            build_parser(chosen_command(arguments)).parse_args(arguments)
        except SystemExit as stop:
            if stop.code not in (0, None):
                refused.append(f"corral {' '.join(arguments)}: {capsys.readouterr().err.strip()}")
    assert refused == []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _environment(scratch: Path) -> dict[str, str]:
    """The test's environment without ``CORRAL_*`` settings, with this checkout's ``corral`` first
    on the PATH (a shim running ``python -m corral`` with the test's interpreter)."""
    bin_dir = scratch / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "corral"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m corral "$@"\n')
    shim.chmod(0o755)
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CORRAL_")}
    environment["PATH"] = f"{bin_dir}{os.pathsep}{environment.get('PATH', '')}"
    environment.setdefault("USER", "reader")
    return environment


class _Up:
    """``corral up FLAGS`` in ``cwd``, until ``stop``; its stdout read on a thread."""

    def __init__(self, cwd: Path, flags: list[str], environment: dict[str, str]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "corral", "up", "--port", str(self.port), *flags],
            cwd=cwd,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_until_up(self) -> None:
        while True:
            try:
                line = self.lines.get(timeout=UP_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"corral up did not start: {''.join(self.seen)}") from None
            if line is None:
                raise AssertionError(f"corral up exited: {''.join(self.seen)}")
            self.seen.append(line)
            if line.startswith("corral is up"):
                return

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()


def _workers_ready(environment: dict[str, str], url: str, count: int) -> None:
    """Wait until ``count`` workers are active: ``corral up`` says it is up once its server
    answers, and a block submitted before its workers registered would see ``queued`` work with
    no worker at all (fine for a reader, who types slower, but not what the blocks show)."""
    script = (
        f"for i in $(seq 1 300); do n=$(corral workers --server {url} --json | "
        f'{sys.executable} -c \'import json,sys; print(sum(w["status"] == "active" for w in '
        f'json.load(sys.stdin)["items"]))\'); [ "$n" -ge {count} ] && exit 0; sleep 0.1; done; exit 1'
    )
    done = subprocess.run(["bash", "-c", script], env=environment, timeout=UP_TIMEOUT_S, check=False)
    assert done.returncode == 0, "the workers of corral up did not register"


def _run(block: Block, cwd: Path, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )


@pytest.mark.timeout(240)
def test_every_runnable_block_of_the_readme_runs(tmp_path: Path) -> None:
    blocks = runnable_blocks(README.read_text())
    scratch = tmp_path / "reader"
    scratch.mkdir()
    (scratch / "examples").symlink_to(ROOT / "examples")
    environment = _environment(tmp_path)
    setups = list(dict.fromkeys(block.setup for block in blocks))
    outputs: dict[int, str] = {}
    for setup in setups:
        group = [block for block in blocks if block.setup == setup]
        up = None
        if setup != NO_SERVER:
            flags = setup.split()
            up = _Up(tmp_path / "reader", flags, environment)
        try:
            block_environment = dict(environment)
            if up is not None:
                up.wait_until_up()
                block_environment["CORRAL_SERVER"] = up.url
                workers = int(flags[flags.index("--workers") + 1]) if "--workers" in flags else 1
                _workers_ready(environment, up.url, workers)
            for block in group:
                done = _run(block, scratch, block_environment)
                assert done.returncode == 0, (
                    f"README.md:{block.line}: the block exited {done.returncode}\n"
                    f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
                )
                outputs[block.line] = done.stdout
        finally:
            if up is not None:
                up.stop()
    # what the blocks say they show, where a line of output tells it
    text = "\n".join(outputs.values())
    assert re.search(r"^j-[0-9a-f]+: done$", text, re.MULTILINE)  # submit --wait
    assert "hello from GPUs 0,1" in text  # the Quick start's worker offers fake GPUs
    assert re.search(r"^\[rank 1\] ", text, re.MULTILINE) is None  # rank 1 exits before printing
    assert "exit 4" in text  # --gpus 64 on 4-GPU workers: unschedulable, given up on


def test_the_sim_example_shows_a_real_difference_between_the_policies(tmp_path: Path) -> None:
    """The README's numbers for ``examples/sim``: the light pool waits minutes under corral and
    hours under FIFO."""
    environment = _environment(tmp_path)
    done = subprocess.run(
        [
            "corral", "sim", "examples/sim/workload.csv", "--cluster", "examples/sim/cluster.csv",
            "--pools", "examples/sim/pools.json", "--policy", "corral,fifo", "--json",
        ],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    summaries = json.loads(done.stdout)  # {policy: summary}
    prod = {policy: summaries[policy]["pools"]["prod"] for policy in ("corral", "fifo")}
    assert prod["corral"]["queue_delay_s"]["p99"] * 100 < prod["fifo"]["queue_delay_s"]["p99"]
    assert summaries["corral"]["preemptions"] > 0 == summaries["fifo"]["preemptions"]
