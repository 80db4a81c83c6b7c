"""``corral <command>``: the parser, the dispatch, and the one place errors become exit codes.

Exit codes (also in ``corral --help``):

- 0: success.
- 1: the server refused the request (4xx/5xx); ``corral: <code>: <message>`` is printed on stderr.
  ``submit --wait`` also exits 1 when the job ends other than ``done``.
- 2: usage error (bad flags or arguments): argparse's own code.
- 3: the server is unreachable; the message names the URL and suggests ``corral up`` (or, when
  TLS failed, what to change: the URL's scheme or ``CORRAL_CA_FILE``).

Commands raise the SDK's ``ApiError`` / ``ServerUnreachable`` and never catch them, so every command
reports failures the same way and no stack trace reaches the user for those cases.
"""

from __future__ import annotations

import argparse
import os
import sys

from corral.cli import (
    cancel,
    events,
    exit_codes,
    jobs,
    logs,
    pools,
    show,
    sim,
    submit,
    up,
    usage,
    why,
    workers,
)
from corral.cli.options import add_server_flag, resolve_server, server_flags
from corral.client import ApiError, ServerUnreachable
from corral.transport import TlsError

COMMANDS = (up, submit, jobs, show, logs, events, why, cancel, workers, pools, usage, sim)


def build_parser() -> argparse.ArgumentParser:
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
    for command in COMMANDS:
        command.add_parser(subcommands, parent)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        arguments = parser.parse_args(argv)
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
