"""The CLI starts fast (issue 23): what ``corral.cli.main`` and the everyday commands import.

Each check runs in a fresh interpreter, so what an earlier test imported cannot hide an import.
What must stay out: the simulator, the scheduling core, the store, the server, the settings, the
wire models and pydantic (about 1.2 s of imports together before issue 23), and httpx; and, for a
command against an ``http://`` server, ``http.client`` (with ``email`` and ``ssl``) and orjson
(with ``dataclasses`` and ``uuid``): ``Client(light=True)``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import pytest

from corral.cli.main import COMMANDS, build_parser, chosen_command

HEAVY = (
    "corral.sim",
    "corral.core",
    "corral.store",
    "corral.server",
    "corral.config",
    "corral.protocol.models",
    "corral.protocol.answers",
    "pydantic",
    "httpx",
    "http.client",
    "email",
    "ssl",
    "orjson",
    "dataclasses",
)

PROBE = """
import json, sys
heavy = {heavy!r}
{body}
loaded = sorted(name for name in sys.modules if any(name == h or name.startswith(h + ".") for h in heavy))
print(json.dumps(loaded))
"""


def heavy_modules_after(body: str) -> list[str]:
    """Run ``body`` in a fresh interpreter; the heavy modules loaded once it is done."""
    code = PROBE.format(heavy=HEAVY, body=body)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_importing_the_cli_loads_nothing_heavy():
    assert heavy_modules_after("import corral.cli.main, corral.main") == []


def test_the_client_loads_no_model_until_an_answer_needs_one():
    assert heavy_modules_after("import corral.client") == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["submit", "--help"],
        ["jobs", "--help"],
        # an unreachable server: the whole command runs, up to its request
        ["jobs", "--server", "http://127.0.0.1:9"],
        ["submit", "--server", "http://127.0.0.1:9", "--", "true"],
    ],
)
def test_the_everyday_commands_load_nothing_heavy(argv):
    body = (
        "import contextlib, io\n"
        "from corral.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    main({argv!r})\n"
    )
    assert heavy_modules_after(body) == []


def _listed(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """command -> its help line, as ``corral --help`` lists it."""
    actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return {choice.dest: choice.help for choice in actions[0]._choices_actions}


def test_the_listing_without_imports_is_the_modules_own():
    """The one-line help ``corral --help`` shows from ``COMMANDS`` (no module imported) is the
    help each module gives its own parser."""
    assert _listed(build_parser(every=True)) == _listed(build_parser()) == COMMANDS


def test_the_chosen_command_skips_the_server_flag():
    assert chosen_command(["--server", "http://x", "jobs", "--all"]) == "jobs"
    assert chosen_command(["--server=http://x", "show", "j-1"]) == "show"
    assert chosen_command(["--help"]) is None
    assert chosen_command([]) is None


def test_help_lists_every_command(capsys):
    from corral.cli.main import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, help_text in COMMANDS.items():
        assert name in out and help_text in out
