"""What every command shares: ``--server``, ``--json``, ``K=V`` arguments and the connection.

The server URL falls back to ``CORRAL_SERVER`` when a command runs (never at import), so a test or
a shell can point the CLI elsewhere without touching flags.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from corral.client_errors import DEFAULT_SERVER

if TYPE_CHECKING:
    from corral.client import Client


def add_server_flag(parser: argparse.ArgumentParser) -> None:
    """``--server``, accepted before the command (``corral --server URL jobs``) and after it.

    Both places default to "not given" so neither overwrites the other; ``resolve_server`` then
    falls back to ``CORRAL_SERVER`` and the built-in default.
    """
    parser.add_argument(
        "--server",
        default=argparse.SUPPRESS,
        metavar="URL",
        help=f"corral server URL [env CORRAL_SERVER; default {DEFAULT_SERVER}]",
    )


def server_flags() -> argparse.ArgumentParser:
    """A parent parser holding ``--server``, for every subcommand that talks to a server."""
    parent = argparse.ArgumentParser(add_help=False)
    add_server_flag(parent)
    return parent


def resolve_server(arguments: argparse.Namespace) -> None:
    """Fill ``arguments.server``: the flag, else ``CORRAL_SERVER``, else the default."""
    if getattr(arguments, "server", None) is None:
        arguments.server = os.environ.get("CORRAL_SERVER") or DEFAULT_SERVER


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the server's answer as JSON (for scripts)")


def key_value(text: str) -> tuple[str, str]:
    """``K=V`` -> ``(K, V)``; the value may itself contain ``=``. A bad pair is a usage error (exit 2)."""
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"expected K=V, got {text!r}")
    return key, value


def connect(arguments: argparse.Namespace) -> Client:
    """The SDK client for ``--server``: every server call of the CLI goes through it. (Imported
    here: ``corral --help`` needs no HTTP stack. ``light``: see ``Client``.)"""
    from corral.client import Client

    return Client(arguments.server, light=True)


#: the help of a positional that takes any handle a submit printed
HANDLE_HELP = "job id (j-…), gang id (g-…) or array id (a-…)"


def handle_kind(handle: str) -> str:
    """``job``, ``gang`` or ``array``: what a handle names, by its prefix (``g-``, ``a-``; a job's
    id, ``j-…``, and any other text are asked of the server as a job, which answers 404)."""
    if handle.startswith("g-"):
        return "gang"
    if handle.startswith("a-"):
        return "array"
    return "job"
