"""``corral <command>``: the parser, the dispatch, and the one place errors become exit codes.

Exit codes (also in ``corral --help``):

- 0: success.
- 1: the server refused the request (4xx/5xx); ``corral: <code>: <message>`` is printed on stderr.
  ``submit --wait`` also exits 1 when the job ends other than ``done``.
- 2: usage error (bad flags or arguments): argparse's own code.
- 3: the server is unreachable; the message names the URL and suggests ``corral up`` (or, when
  TLS failed, what to change: the URL's scheme or ``CORRAL_CA_FILE``).
- 4: ``submit --wait`` gave up on a job no registered worker could ever hold (``unschedulable``
  for ``--unschedulable-after`` seconds).

Commands raise the SDK's ``ApiError`` / ``ServerUnreachable`` and never catch them, so every command
reports failures the same way and no stack trace reaches the user for those cases.

Start-up is kept short (issue 23: a command a user types dozens of times a day should answer at
once): only the chosen command's module is imported, and ``corral --help`` imports none. Each other
command is a stub in the parser, named with its one-line help from ``COMMANDS``, so the listing and
"unknown command" stay argparse's own. ``tests/unit/test_cli_startup.py`` checks that the table's
help lines are the modules' own.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from corral.cli import exit_codes
from corral.cli.options import add_server_flag, resolve_server, server_flags
from corral.client_errors import ApiError, ServerUnreachable
from corral.http_response import TlsError

#: command -> its one-line help, in the order ``corral --help`` lists them; the module is
#: ``corral.cli.<command>``, imported only when that command is chosen
COMMANDS: dict[str, str] = {
    "up": "start a local server and worker",
    "submit": "submit a job (or a gang)",
    "jobs": "list jobs",
    "show": "every field of a job (or a gang, an array)",
    "logs": "what a job (or a gang, an array) printed",
    "events": "a job's (or gang's, array's) status changes",
    "why": "why a job (or gang, array) is not running",
    "cancel": "cancel jobs (or gangs, arrays)",
    "workers": "list workers; drain, undrain or remove one",
    "pools": "list pools; set or delete one",
    "usage": "GPU- and CPU-hours per user and pool over a window",
    "sim": "simulate a workload on a cluster with corral's own core",
}


def chosen_command(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word that is not a flag (nor ``--server``'s value)."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--server":
            index += 2
            continue
        if word == "--":
            return argv[index + 1] if index + 1 < len(argv) else None
        if not word.startswith("-"):
            return word
        index += 1
    return None


def build_parser(chosen: str | None = None, every: bool = False) -> argparse.ArgumentParser:
    """The parser with ``chosen``'s module (every command's with ``every``: tests) and stubs for
    the others."""
    parser = argparse.ArgumentParser(
        prog="corral",
        description="corral: a job scheduler for GPU clusters. `corral up` starts a local server and worker.",
        epilog=exit_codes.EPILOG
        + "\nalso: `corral server` and `corral worker` run the server and a worker (see their --help)."
        + "\nauthentication: every command sends the token in CORRAL_TOKEN (Authorization: Bearer)."
        + "\nTLS: an https:// server is verified with the CA in CORRAL_CA_FILE (else the trust store).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_flag(parser)
    subcommands = parser.add_subparsers(title="commands", metavar="COMMAND")
    parent = server_flags()
    for name, help_text in COMMANDS.items():
        if every or name == chosen:
            importlib.import_module(f"corral.cli.{name}").add_parser(subcommands, parent)
        else:
            subcommands.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments_given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(chosen_command(arguments_given))
    try:
        arguments = parser.parse_args(arguments_given)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else exit_codes.USAGE
    if getattr(arguments, "run", None) is None:
        parser.print_help(sys.stderr)
        return exit_codes.USAGE
    resolve_server(arguments)
    try:
        code: int = arguments.run(arguments)
    except ApiError as error:
        print(f"corral: {error.code}: {error.message}", file=sys.stderr)
        return exit_codes.REFUSED
    except ServerUnreachable as error:
        print(_unreachable_message(error), file=sys.stderr)
        return exit_codes.UNREACHABLE
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    except BrokenPipeError:
        # `corral jobs | head`: the reader left; stop quietly and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_codes.OK
    return code


def _unreachable_message(error: ServerUnreachable) -> str:
    cause = error.__cause__ or error
    if isinstance(cause, TlsError):
        # The server may well be up: what to change is the URL or CORRAL_CA_FILE, not `corral up`.
        return f"corral: cannot connect securely to the corral server at {error.url}: {cause}"
    return (
        f"corral: cannot reach the corral server at {error.url} ({cause}); "
        "start one with `corral up`, or point --server / CORRAL_SERVER at a running one"
    )
