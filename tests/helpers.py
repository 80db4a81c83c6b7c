"""Helpers shared by test modules, in one place so that no test module imports another.

Sections: property tests (Hypothesis budgets and the check that a generator produces every shape
it claims); the store contract's seeds; requests to a live server; the CLI and promtool.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture.providers import HypothesisProvider

from corral.cli.main import main
from corral.core.claim import Claim
from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.domain.status import is_allowed
from corral.store.base import WorkerRegistration
from tests.contract import protocol

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
    never meeting that shape.

    Hypothesis mixes into a twentieth of its draws literals read from every module the process
    has imported so far (``HypothesisProvider._maybe_draw_constant``): what it draws, derandomized
    or not, then depends on which tests ran before (a test file alone drew 12 reclaims in 120
    cases, the same file in the whole suite none). The count turns that off while it draws."""
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

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(HypothesisProvider, "_maybe_draw_constant", _no_constant)
        draw()
    return seen


def _no_constant(*_arguments: Any, **_keywords: Any) -> None:
    return None


def missing_shapes(seen: Counter[str], claimed: Iterable[str]) -> list[str]:
    """The claimed shapes never drawn (the assertion's message names them)."""
    return [shape for shape in claimed if not seen[shape]]


# --- the store contract's seeds ---------------------------------------------------------------------

NOW = 1_800_000_000.0
POLICY = Claim()
_submissions = itertools.count()


def spec(command="true", **fields):
    return JobSpec(command=command, **fields)


def register(store, worker_id="w1", gpus=0, cpus=8, memory_mb=8192, vram_mb=0, **fields):
    return store.workers.register_worker(
        WorkerRegistration(worker_id, "127.0.0.1", Resources(gpus, vram_mb, memory_mb, cpus), **fields), NOW
    )


def submit_one(store, **fields):
    """Submit one job, each a millisecond after the previous, so queue order is submission order."""
    return protocol.submit(store, [spec(**fields)], NOW + next(_submissions) / 1000).items[0].job


def assert_history_is_legal(store, job_id):
    """Every event is an allowed transition and each one starts where the previous ended."""
    events = store.jobs.job_events(job_id)
    previous = None
    for event in events:
        assert event.from_status == previous
        assert is_allowed(event.from_status, event.to_status), (event.from_status, event.to_status)
        previous = event.to_status
    return events


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan tree, depth first."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


# --- requests to a live server (an httpx client on ServerThread) ------------------------------------


def gang_workers(api, count=2, gpus=1):
    for index in range(count):
        api.post(
            "/workers/register",
            json={
                "id": f"w{index}",
                "address": f"10.0.0.{index + 1}",
                "resources": {"gpus": gpus, "vram_mb": 1000, "cpus": 4},
            },
        ).raise_for_status()


def submit_gang(api, size=2, **fields):
    response = api.post(
        "/jobs", json={"command": "train", "gang_size": size, "resources": {"gpus": 1}, **fields}
    )
    assert response.status_code == 201
    return response.json()


def claim(api, worker_id):
    response = api.get("/jobs/next", params={"worker_id": worker_id})
    assert response.status_code == 200, response.text
    return response.json()


def fenced(job, **extra):
    return {"worker_id": job["worker_id"], "attempt": job["attempt"], **extra}


def admitted_and_running(api, server, size=2):
    gang_workers(api, size)
    gang = submit_gang(api, size)
    server.run_loop("admission")
    return gang, [claim(api, f"w{index}") for index in range(size)]


def send(api, job, offset, data, attempt=None, worker_id=None):
    return api.post(
        f"/jobs/{job['id']}/logs",
        params={
            "worker_id": worker_id or job["worker_id"],
            "attempt": attempt or job["attempt"],
            "offset": offset,
        },
        content=data,
        headers={"content-type": "application/octet-stream"},
    )


def leader_of(url: str, loop: str) -> bool:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    match = re.search(rf'corral_loop_leader{{loop="{loop}"}} ([0-9.]+)', text)
    return bool(match and float(match.group(1)) == 1.0)


# --- the CLI and promtool ---------------------------------------------------------------------------


def corral(server: Any, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``corral <argv> --server <url>``; return (exit code, stdout, stderr)."""
    capsys.readouterr()
    command, *rest = argv
    code = main([command, "--server", server.url, *rest])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = "promtool is not installed: apt-get install -y prometheus"
        if os.environ.get("CI") or os.environ.get("CORRAL_REQUIRE_POSTGRES") == "1":
            pytest.fail(message)  # CI installs it (.ci/run): never a silent skip there
        pytest.skip(message)
    return path
