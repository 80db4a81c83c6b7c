"""Helpers shared by test modules, in one place so that no test module imports another.

Sections: property tests (Hypothesis budgets and the check that a generator produces every shape
it claims); the store contract's seeds; requests to a live server; the CLI and promtool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

T = TypeVar("T")

# --- property tests ------------------------------------------------------------------------------

#: the ``max_examples`` of the ``ci`` profile (tests/conftest.py): the budgets below are written
#: against it and scale with the profile loaded (ten times under ``thorough``)
CI_EXAMPLES = 100


def examples(count: int, **more: Any) -> settings:
    """A property's budget of ``count`` examples under the ``ci`` profile: chosen so that the
    property costs about what its seed loop did, scaled by the profile loaded. ``more``: other
    settings of this property."""
    scale = settings.default.max_examples / CI_EXAMPLES
    return settings(
        max_examples=max(1, round(count * scale)),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        **more,
    )


class Drawn:
    """The few methods of ``random.Random`` the generators call, each a Hypothesis draw: a
    generator written against it is a strategy (``st.composite``) whose examples shrink, the
    shapes it draws unchanged. ``random()`` is drawn in thousandths so that it shrinks to 0."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def choice(self, items: Sequence[T]) -> T:
        return self.draw(st.sampled_from(items))

    def randint(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))

    def randrange(self, stop: int) -> int:
        return self.draw(st.integers(0, stop - 1))

    def random(self) -> float:
        return self.draw(st.integers(0, 999)) / 1000

    def uniform(self, low: float, high: float) -> float:
        return self.draw(st.floats(low, high))

    def sample(self, items: Sequence[T], count: int) -> list[T]:
        return self.draw(st.permutations(items))[:count]

    def shuffle(self, items: list[Any]) -> None:
        items[:] = self.draw(st.permutations(items))


def shapes_drawn(
    strategy: st.SearchStrategy[T], shapes_of: Callable[[T], Iterable[str]], count: int
) -> Counter[str]:
    """How often each shape ``shapes_of`` names occurs in ``count`` examples of ``strategy``,
    drawn the same way on every run (derandomized, generation only: nothing to shrink). A test
    asserts each shape a generator claims occurs, so that a property over it cannot pass by
    never meeting that shape."""
    seen: Counter[str] = Counter()

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def draw(value: Any) -> None:
        seen.update(set(shapes_of(value)))

    draw()
    return seen


def missing_shapes(seen: Counter[str], claimed: Iterable[str]) -> list[str]:
    """The claimed shapes never drawn (the assertion's message names them)."""
    return [shape for shape in claimed if not seen[shape]]
