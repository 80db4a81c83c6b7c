"""Output for people (aligned tables, short times) and for scripts (``--json``).

Tables are for reading, so long cells are cut; ``--json`` prints what the server said, unchanged, so
scripts never parse a table. Values come as typed answers or as the plain JSON data the everyday
commands read (``Client.request_json``): both are read by item (``job["id"]``), so this module
needs no answer model. JSON goes through the standard library's ``json``, not orjson: its import
costs more than a whole short command (see ``Client``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from corral.domain.wording import worded_reason

MISSING = "-"


def print_json(value: Any) -> None:
    """The server's answer as indented JSON, one document per call (field names as on the wire)."""
    sys.stdout.write(json.dumps(plain(value), indent=2, ensure_ascii=False) + "\n")


def plain(value: Any) -> Any:
    """Typed answers (and lists or dicts of them) as the JSON data they came from."""
    to_wire = getattr(value, "to_wire", None)
    if to_wire is not None:  # a typed answer (``corral.protocol.answers.Answer``)
        return to_wire()
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns left-aligned and two spaces apart; the last column is not padded."""
    widths = [len(header) for header in headers]
    for row in rows:
        for index, value in enumerate(row):
            widths[index] = max(widths[index], len(value))
    for line in [list(headers), *rows]:
        cells = [value.ljust(width) for value, width in zip(line[:-1], widths, strict=False)]
        sys.stdout.write("  ".join([*cells, line[-1]]).rstrip() + "\n")


def cell(value: Any) -> str:
    """A table cell: ``-`` for a missing value, so columns never collapse."""
    if value is None or value == "":
        return MISSING
    return str(value)


def truncate(text: str | None, width: int) -> str:
    """At most ``width`` characters on one line, with ``…`` where text was cut."""
    if not text:
        return MISSING
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def short_time(timestamp: str | None) -> str:
    """``2024-05-01T12:03:04.123Z`` -> ``2024-05-01 12:03:04`` (UTC, seconds are enough to read)."""
    if not timestamp:
        return MISSING
    return timestamp.replace("T", " ").split(".")[0].rstrip("Z")


def reason_text(reason: Mapping[str, Any] | Any | None) -> str:
    """A reason ``{code, message}`` (plain or a ``ReasonAnswer``) as ``code: message``: the same
    words as the dashboard's (``wording.worded_reason``)."""
    if not reason:
        return MISSING
    return worded_reason(reason["code"], reason["message"])


def pairs(mapping: Mapping[str, Any] | None) -> str:
    """``{"gpus": 1, "cpus": 2}`` -> ``gpus=1 cpus=2``; nested values as compact JSON."""
    if not mapping:
        return MISSING
    parts = []
    for key, value in mapping.items():
        shown = (
            json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            if isinstance(value, dict | list)
            else value
        )
        parts.append(f"{key}={shown}")
    return " ".join(parts)


def counts_text(counts: Mapping[str, int]) -> str:
    """An array's counts by status: ``3 done, 5 pending`` (statuses in name order)."""
    return ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
