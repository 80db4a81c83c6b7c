"""``corral usage``: GPU- and CPU-hours per user, pool or both over a window (API.md "Usage").

``--since`` and ``--until`` take an RFC 3339 time or a span back from now (``7d``, ``24h``, ``30m``,
``2w``); the server's window is the last 7 days when neither is given. A user's token sees its own
rows only.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect
from corral.domain.clock import from_rfc3339, to_rfc3339
from corral.protocol.answers import UsageItem

HEADERS = ("USER", "POOL", "GPU-HOURS", "CPU-HOURS", "ATTEMPTS", "JOBS", "WAIT-P50", "WAIT-P90")
_SPAN = re.compile(r"(?P<amount>\d+(?:\.\d+)?)(?P<unit>[smhdw])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def moment(text: str, now: float | None = None) -> str:
    """``text`` as the RFC 3339 time the API takes: a span (``7d``) counts back from ``now``."""
    span = _SPAN.fullmatch(text.strip())
    if span is not None:
        seconds = float(span["amount"]) * _UNIT_S[span["unit"]]
        stamp = to_rfc3339((time.time() if now is None else now) - seconds)
        assert stamp is not None
        return stamp
    try:
        from_rfc3339(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an RFC 3339 time nor a span such as 7d, 24h or 30m"
        ) from None
    return text


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "usage",
        parents=[parent],
        help="GPU- and CPU-hours per user and pool over a window",
        description=(
            "What the attempts that held resources in a window used (failed, preempted and "
            "cancelled ones too), each attempt counted inside the window only. WAIT-P50 and "
            "WAIT-P90 are how long jobs waited for their first attempt, in seconds. A user's "
            "token sees its own rows only."
        ),
    )
    parser.add_argument("--since", type=moment, help="RFC 3339 time or span back from now (default: 7d)")
    parser.add_argument("--until", type=moment, help="RFC 3339 time or span back from now (default: now)")
    parser.add_argument(
        "--by", choices=("user", "pool", "user,pool"), default="user,pool", help="how rows are grouped"
    )
    add_json_flag(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    with connect(arguments) as client:
        page = client.usage(arguments.since, arguments.until, arguments.by)
    if arguments.json:
        output.print_json(page)
    else:
        output.print_table(HEADERS, [_row(item) for item in page.items])
    return exit_codes.OK


def _row(item: UsageItem) -> list[str]:
    return [
        output.cell(item.user),
        output.cell(item.pool),
        f"{item.gpu_seconds / 3600:.2f}",
        f"{item.cpu_seconds / 3600:.2f}",
        str(item.attempts),
        str(item.jobs),
        _seconds(item.wait_s.p50),
        _seconds(item.wait_s.p90),
    ]


def _seconds(value: float | None) -> str:
    return output.MISSING if value is None else f"{value:.0f}"
