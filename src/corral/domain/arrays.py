"""The array expression of a submit (API.md "Arrays and dependencies"): ``"0-99"``, ``"0-99:4"``
(every fourth), ``"1,5,7"``, each with ``%N`` to run at most N tasks at once (``"0-99%8"``)."""

from __future__ import annotations

import re

from corral.domain import errors
from corral.domain.records import ArraySpec

#: the most tasks one array may have
MAX_ARRAY_TASKS = 10_000

_RANGE = re.compile(r"(?P<first>\d+)-(?P<last>\d+)(?::(?P<step>\d+))?")


def parse_array(text: str) -> ArraySpec:
    """The indices and throttle ``text`` names; ``InvalidRequest`` (field ``array``) when it is not
    one of the forms above, names no index, repeats one, or names more than ``MAX_ARRAY_TASKS``."""
    expression, _, throttle_text = text.strip().partition("%")
    throttle: int | None = None
    if throttle_text:
        if not throttle_text.isdigit() or int(throttle_text) < 1:
            raise _invalid(text, "the %N throttle must be a positive integer")
        throttle = int(throttle_text)
    indices: list[int] = []
    for part in expression.split(","):
        part = part.strip()
        if part.isdigit():
            indices.append(int(part))
        elif (match := _RANGE.fullmatch(part)) is not None:
            first, last = int(match["first"]), int(match["last"])
            step = int(match["step"]) if match["step"] is not None else 1
            if step < 1 or last < first:
                raise _invalid(text, f"range {part!r} is empty")
            if (last - first) // step + 1 + len(indices) > MAX_ARRAY_TASKS:
                raise _invalid(text, f"an array has at most {MAX_ARRAY_TASKS} tasks")
            indices.extend(range(first, last + 1, step))
        else:
            raise _invalid(text, f"{part!r} is not an index or a range")
        if len(indices) > MAX_ARRAY_TASKS:
            raise _invalid(text, f"an array has at most {MAX_ARRAY_TASKS} tasks")
    if len(set(indices)) != len(indices):
        raise _invalid(text, "an index is named twice")
    return ArraySpec(tuple(indices), throttle)


def _invalid(text: str, why: str) -> errors.InvalidRequest:
    return errors.InvalidRequest(f"invalid array {text!r}: {why}", field="array")
