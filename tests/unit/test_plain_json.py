"""A free-form JSON value of a body (``progress``, a watchdog's ``detail``): no NUL, at most
``MAX_JSON_DEPTH`` deep, and of two faults the one the value's last items hold is named (the
order of the explicit stack the recursive check replaced)."""

from __future__ import annotations

from typing import Any

import pytest

from corral.protocol.models import MAX_JSON_DEPTH, _plain_json

NUL_MESSAGE = "must not contain a NUL character"
DEPTH_MESSAGE = f"must not nest arrays and objects more than {MAX_JSON_DEPTH} deep"


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"inner": value}
    return value


def test_a_value_at_the_depth_limit_is_taken() -> None:
    value = {"step": 3, "losses": [0.5, 0.25], "inner": nested(MAX_JSON_DEPTH - 1)}

    assert _plain_json(value) is value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (nested(MAX_JSON_DEPTH + 1), DEPTH_MESSAGE),
        ({"a\0": 1}, NUL_MESSAGE),
        ({"a": ["ok", "b\0"]}, NUL_MESSAGE),
        # a key is checked before any item; items from the last to the first
        ({"a": nested(MAX_JSON_DEPTH), "b\0": 1}, NUL_MESSAGE),
        ({"a": "x\0", "b": nested(MAX_JSON_DEPTH)}, DEPTH_MESSAGE),
        ({"b": nested(MAX_JSON_DEPTH), "a": "x\0"}, NUL_MESSAGE),
    ],
)
def test_the_fault_named(value: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _plain_json(value)
