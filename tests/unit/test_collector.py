"""``corral server``'s collector threshold (``server.collector``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from corral.server import collector


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_the_first_threshold_is_set_and_the_others_kept(thresholds: tuple[int, int, int]) -> None:
    collector.set_first_threshold(50_000)
    assert gc.get_threshold() == (50_000, thresholds[1], thresholds[2])


def test_zero_leaves_the_interpreters_threshold(thresholds: tuple[int, int, int]) -> None:
    collector.set_first_threshold(0)
    assert gc.get_threshold() == thresholds
