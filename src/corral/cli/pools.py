"""``corral pools``: the pool tree; ``corral pools set PATH`` and ``corral pools delete PATH``.

``set`` changes only the settings it is given: it reads what the pool stores, applies the flags
(``--inherit NAME`` clears one), and sends the whole result (``PUT`` replaces every setting). A
pool that does not exist yet is created. Values are checked by the server (exit 1 on a bad one).
"""

from __future__ import annotations

import argparse
from typing import Any

from corral.cli import exit_codes, output
from corral.cli.options import add_json_flag, connect
from corral.client import ApiError
from corral.domain.pools import PoolKind, PoolMode
from corral.protocol.answers import LimitsAnswer, PoolAnswer

HEADERS = (
    "POOL",
    "KIND",
    "WEIGHT",
    "GUARANTEE-GPUS",
    "LIMIT-GPUS",
    "USAGE-GPUS",
    "DEMAND-GPUS",
    "FAIR-GPUS",
    "SATISFACTION",
    "STARVATION",
    "JOBS",
)
_RESOURCES = ("gpus", "vram_mb", "memory_mb", "cpus")
#: the scalar settings ``set`` takes as flags: (setting, type, choices, help)
_SCALARS: tuple[tuple[str, Any, list[str] | None, str], ...] = (
    ("weight", float, None, "fair-share weight (> 0; default 1)"),
    ("mode", str, [mode.value for mode in PoolMode], "how the pool orders its jobs (inherited)"),
    ("kind", str, [kind.value for kind in PoolKind], "what preemption may do to its jobs (inherited)"),
    ("starvation_timeout_s", float, None, "below fair share this long: starving (inherited)"),
    ("aggressive_starvation_timeout_s", float, None, "... this long: aggressively starving (inherited)"),
    ("starvation_tolerance", float, None, "in (0, 1]: below fair share x this is below it (inherited)"),
    ("default_walltime_s", float, None, "walltime_s of a job that sets none (inherited)"),
    ("max_walltime_s", float, None, "the most walltime_s a submit may ask for (inherited)"),
)
_SWITCHES = (
    ("enable_aggressive_starvation", "aggressive-starvation", "let starving jobs preempt aggressively"),
    (
        "allow_aggressive_preemption",
        "aggressive-preemption",
        "let this pool's jobs be preempted aggressively",
    ),
)
_SETTINGS = (
    *(name for name, _, _, _ in _SCALARS),
    "guarantee",
    "limits",
    *(name for name, _, _ in _SWITCHES),
)


def add_parser(subcommands: Any, parent: argparse.ArgumentParser) -> None:
    parser = subcommands.add_parser(
        "pools",
        parents=[parent],
        help="list pools; set or delete one",
        description=(
            "List the pool tree. GUARANTEE, LIMIT, USAGE (reserved, running, preempting), DEMAND "
            "(waiting) and FAIR (its fair share now) are GPUs of the pool's whole subtree; "
            "SATISFACTION is usage over fair share; STARVATION says since when a pool below its fair "
            "share has been so; * marks a pool only implied by a child."
        ),
    )
    add_json_flag(parser)
    parser.set_defaults(run=run_list)
    actions = parser.add_subparsers(title="actions", metavar="ACTION")

    setter = actions.add_parser(
        "set",
        parents=[parent],
        help="create a pool or change its settings",
        description=(
            "Create a pool or change the settings given; the others stay as stored (--inherit NAME "
            "clears one, so the pool inherits it again). Ancestors that do not exist are created."
        ),
    )
    setter.add_argument("path", metavar="PATH", help="pool path, e.g. team/project")
    for name, kind, choices, text in _SCALARS:
        setter.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, choices=choices, help=text)
    for prefix in ("guarantee", "limit"):
        for resource in _RESOURCES:
            setter.add_argument(
                f"--{prefix}-{resource.replace('_', '-')}",
                dest=f"{prefix}_{resource}",
                type=int,
                help=f"{prefix} of {resource} for the subtree",
            )
    for name, flag, text in _SWITCHES:
        setter.add_argument(f"--{flag}", dest=name, action=argparse.BooleanOptionalAction, help=text)
    setter.add_argument(
        "--inherit",
        action="append",
        default=[],
        choices=_SETTINGS,
        metavar="SETTING",
        help=f"clear a stored setting (repeatable): {', '.join(_SETTINGS)}",
    )
    # ``corral pools --json set ...`` and ``corral pools set ... --json`` both: the subcommand's
    # flag must not reset the one given before it
    setter.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the pool as JSON"
    )
    setter.set_defaults(run=run_set)

    deleter = actions.add_parser(
        "delete",
        parents=[parent],
        help="delete a pool",
        description="Delete a pool: refused while it has child pools or unfinished jobs, and for default.",
    )
    deleter.add_argument("path", metavar="PATH")
    deleter.set_defaults(run=run_delete)


def run_list(arguments: argparse.Namespace) -> int:
    with connect(arguments) as client:
        items = client.pools()
    if arguments.json:
        output.print_json({"items": items})
    else:
        output.print_table(HEADERS, [_row(pool) for pool in items])
    return exit_codes.OK


def run_set(arguments: argparse.Namespace) -> int:
    with connect(arguments) as client:
        try:
            stored = client.pool(arguments.path).settings.to_wire()
        except ApiError as error:
            if error.status != 404:
                raise
            stored = {}
        pool = client.put_pool(arguments.path, _merged(stored, arguments))
    if getattr(arguments, "json", False):
        output.print_json(pool)
    else:
        output.print_table(HEADERS, [_row(pool)])
    return exit_codes.OK


def run_delete(arguments: argparse.Namespace) -> int:
    with connect(arguments) as client:
        client.delete_pool(arguments.path)
    return exit_codes.OK


def _merged(stored: dict[str, Any], arguments: argparse.Namespace) -> dict[str, Any]:
    """The PUT body: the stored settings, the flags given on top, ``--inherit`` ones cleared."""
    body = {name: value for name, value in stored.items() if value is not None}
    for name in (*(name for name, _, _, _ in _SCALARS), *(name for name, _, _ in _SWITCHES)):
        if getattr(arguments, name) is not None:
            body[name] = getattr(arguments, name)
    for setting, prefix in (("guarantee", "guarantee"), ("limits", "limit")):
        given = {
            resource: getattr(arguments, f"{prefix}_{resource}")
            for resource in _RESOURCES
            if getattr(arguments, f"{prefix}_{resource}") is not None
        }
        if given:
            body[setting] = {**(body.get(setting) or {}), **given}
    for name in arguments.inherit:
        body.pop(name, None)
    return body


def _row(pool: PoolAnswer) -> list[str]:
    depth = pool.path.count("/")
    name = "  " * depth + pool.path.rsplit("/", 1)[-1] + ("" if pool.explicit else " *")
    return [
        name,
        pool.kind,
        f"{pool.weight:g}",
        str(pool.guarantee.gpus),
        _limit(pool.limits),
        str(pool.usage.gpus),
        str(pool.demand.gpus),
        f"{pool.fair_share.gpus:.1f}",
        output.MISSING if pool.satisfaction is None else f"{pool.satisfaction:.2f}",
        _starvation(pool),
        str(pool.jobs),
    ]


def _starvation(pool: PoolAnswer) -> str:
    """``starving since 12:00:05``, ``below since ...`` while the timer runs, else ``-``."""
    if pool.starvation != "non_starving" and pool.starvation_since is not None:
        return f"{pool.starvation.replace('_', ' ')} since {output.short_time(pool.starvation_since)}"
    if pool.below_fair_share_since is not None:
        return f"below since {output.short_time(pool.below_fair_share_since)}"
    return output.MISSING


def _limit(limits: LimitsAnswer | None) -> str:
    if limits is None or limits.gpus is None:
        return output.MISSING
    return str(limits.gpus)
