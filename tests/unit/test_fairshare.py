"""Fair share (``corral.core.fairshare``): the water-filling of seed 002's source and its worked
examples (``shared/reference/semantics.md`` B.2), the below-fair-share test (B.3), the starvation
timers (B.4), the prefix rule (B.5), the plan's books and the words ``why`` shows."""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from corral.core import fairshare
from corral.core.fairshare import Books, Claim, FairShareState, Group, PoolShare, water_fill
from corral.domain.pools import (
    NOT_STARVING,
    UNLIMITED,
    Pool,
    PoolDefaults,
    PoolSettings,
    PoolUsage,
    Starvation,
    StarvationState,
    resolve,
)
from corral.domain.resources import Resources
from tests.helpers import Drawn, examples, missing_shapes, shapes_drawn

#: a cluster of 10 GPUs (so a GPU is 0.1 of it), 100 CPUs, 1,000 MB
TOTAL = Resources(gpus=10, cpus=100, memory_mb=1000)


def gpus(held: int = 0, waiting: int = 0) -> PoolUsage:
    return PoolUsage(held=Resources(gpus=held), demand=Resources(gpus=waiting))


def tree(**settings: PoolSettings) -> dict[str, Pool]:
    """Pools by path (``a__b`` is ``a/b``), resolved under the defaults."""
    return resolve({path.replace("__", "/"): value for path, value in settings.items()}, PoolDefaults())


def shares(pools: dict[str, Pool], usage: dict[str, PoolUsage], total: Resources = TOTAL) -> dict[str, float]:
    found = fairshare.compute(pools, usage, total)
    return {path: share.fair_share for path, share in found.pools.items() if path != "default"}


# --- water-filling: B.2's worked examples --------------------------------------------------------


def test_b2_guarantees_point_6_and_point_2_equal_weights_give_point_6_and_point_4() -> None:
    assert water_fill([Claim(1, 0.6, 1.0), Claim(1, 0.2, 1.0)], 1.0) == pytest.approx([0.6, 0.4])
    pools = tree(a=PoolSettings(guarantee=Resources(gpus=6)), b=PoolSettings(guarantee=Resources(gpus=2)))
    assert shares(pools, {"a": gpus(0, 10), "b": gpus(0, 10)}) == pytest.approx({"a": 0.6, "b": 0.4})


def test_b2_weights_3_to_1_give_point_75_and_point_25() -> None:
    assert water_fill([Claim(3, 0.6, 1.0), Claim(1, 0.2, 1.0)], 1.0) == pytest.approx([0.75, 0.25])
    pools = tree(
        a=PoolSettings(weight=3, guarantee=Resources(gpus=6)),
        b=PoolSettings(weight=1, guarantee=Resources(gpus=2)),
    )
    assert shares(pools, {"a": gpus(0, 10), "b": gpus(0, 10)}) == pytest.approx({"a": 0.75, "b": 0.25})


def test_b2_adding_c_without_a_guarantee_gives_point_6_point_2_point_2() -> None:
    claims = [Claim(1, 0.6, 1.0), Claim(1, 0.2, 1.0), Claim(1, 0.0, 1.0)]
    assert water_fill(claims, 1.0) == pytest.approx([0.6, 0.2, 0.2])
    pools = tree(
        a=PoolSettings(guarantee=Resources(gpus=6)),
        b=PoolSettings(guarantee=Resources(gpus=2)),
        c=PoolSettings(),
    )
    usage = {"a": gpus(0, 10), "b": gpus(0, 10), "c": gpus(0, 10)}
    assert shares(pools, usage) == pytest.approx({"a": 0.6, "b": 0.2, "c": 0.2})


# --- water-filling: demand, weights, limits, guarantees -------------------------------------------


def test_a_pool_never_gets_more_than_it_asks_for_and_the_rest_flows_to_siblings_by_weight() -> None:
    pools = tree(a=PoolSettings(), b=PoolSettings(weight=1), c=PoolSettings(weight=3))
    # a asks for 1 GPU (0.1): it gets 0.1; the 0.9 left goes 1:3 to b and c
    found = shares(pools, {"a": gpus(1, 0), "b": gpus(0, 10), "c": gpus(0, 10)})
    assert found == pytest.approx({"a": 0.1, "b": 0.225, "c": 0.675})
    # b asks for 1 GPU more than it has (2 of 10): capped, c takes what b leaves
    found = shares(pools, {"a": gpus(1, 0), "b": gpus(1, 1), "c": gpus(0, 10)})
    assert found == pytest.approx({"a": 0.1, "b": 0.2, "c": 0.7})


def test_when_everyone_asks_for_less_than_the_cluster_each_gets_its_demand() -> None:
    pools = tree(a=PoolSettings(weight=5), b=PoolSettings())
    assert shares(pools, {"a": gpus(1, 1), "b": gpus(3, 0)}) == pytest.approx({"a": 0.2, "b": 0.3})


def test_a_pool_asking_for_nothing_has_no_fair_share() -> None:
    pools = tree(a=PoolSettings(weight=100, guarantee=Resources(gpus=5)), b=PoolSettings())
    assert shares(pools, {"b": gpus(2, 20)}) == pytest.approx({"a": 0.0, "b": 1.0})


def test_limits_cap_a_pools_share_and_its_siblings_get_the_rest() -> None:
    # as ``PUT /pools`` stores {"gpus": 2}: every other resource UNLIMITED
    limited = Resources(gpus=2, vram_mb=UNLIMITED, memory_mb=UNLIMITED, cpus=UNLIMITED)
    pools = tree(a=PoolSettings(limits=limited), b=PoolSettings())
    assert shares(pools, {"a": gpus(0, 10), "b": gpus(0, 10)}) == pytest.approx({"a": 0.2, "b": 0.8})
    # a limit on a resource that is not the dominant one caps the demand's shape: a asks for 10
    # GPUs and 50 CPUs, and may use 20 CPUs -> 4 GPUs' worth
    limited = Resources(gpus=UNLIMITED, vram_mb=UNLIMITED, memory_mb=UNLIMITED, cpus=20)
    pools = tree(a=PoolSettings(limits=limited), b=PoolSettings())
    usage = {"a": PoolUsage(demand=Resources(gpus=10, cpus=50)), "b": gpus(0, 10)}
    found = fairshare.compute(pools, usage, TOTAL)
    assert found.pools["a"].fair_share == pytest.approx(0.4)
    assert found.pools["a"].fair == pytest.approx((0.4, 0.2, 0.0))
    assert found.pools["b"].fair_share == pytest.approx(0.6)


def test_a_guarantee_is_capped_by_demand() -> None:
    pools = tree(a=PoolSettings(guarantee=Resources(gpus=8)), b=PoolSettings())
    assert shares(pools, {"a": gpus(1, 2), "b": gpus(0, 10)}) == pytest.approx({"a": 0.3, "b": 0.7})


def test_guarantees_above_the_parents_share_scale_down_together() -> None:
    pools = tree(
        p__a=PoolSettings(guarantee=Resources(gpus=4)),
        p__b=PoolSettings(guarantee=Resources(gpus=2)),
        q=PoolSettings(),
    )
    # p gets 0.5 (no guarantee of its own, the same weight as q); its children's guarantees add up
    # to 0.6 > 0.5: they scale down 4:2
    found = shares(pools, {"p/a": gpus(0, 10), "p/b": gpus(0, 10), "q": gpus(0, 10)})
    assert found == pytest.approx({"p": 0.5, "p/a": 1 / 3, "p/b": 1 / 6, "q": 0.5})
    # guarantees adding up to more than the whole cluster scale down to it
    assert water_fill([Claim(1, 0.9, 1.0), Claim(1, 0.6, 1.0)], 1.0) == pytest.approx([0.6, 0.4])


def test_a_three_level_tree_shares_down_each_level_by_weight() -> None:
    pools = tree(
        org__ml__train=PoolSettings(weight=3),
        org__ml__eval=PoolSettings(weight=1),
        org__web=PoolSettings(weight=1),
        ops=PoolSettings(weight=1),
    )
    usage = {
        "org/ml/train": gpus(0, 10),
        "org/ml/eval": gpus(0, 10),
        "org/web": gpus(0, 10),
        "ops": gpus(0, 10),
    }
    found = shares(pools, usage)
    assert found == pytest.approx(
        {
            "org": 0.5,
            "org/ml": 0.25,
            "org/ml/train": 0.1875,
            "org/ml/eval": 0.0625,
            "org/web": 0.25,
            "ops": 0.5,
        }
    )
    # what one leaf leaves flows to its sibling first, then up: eval asks for nothing
    usage["org/ml/eval"] = PoolUsage()
    found = shares(pools, usage)
    assert found["org/ml/train"] == pytest.approx(0.25) and found["org/ml/eval"] == 0.0
    # the whole subtree asks for 1 GPU: the rest goes to ops
    usage = {"org/ml/train": gpus(1, 0), "ops": gpus(0, 10)}
    assert shares(pools, usage) == pytest.approx(
        {"org": 0.1, "org/ml": 0.1, "org/ml/train": 0.1, "org/ml/eval": 0.0, "org/web": 0.0, "ops": 0.9}
    )


def test_own_jobs_of_a_pool_with_children_count_as_one_more_child_of_weight_1() -> None:
    pools = tree(team__x=PoolSettings(weight=1), team__y=PoolSettings(weight=2), other=PoolSettings())
    usage = {"team": gpus(0, 10), "team/x": gpus(0, 10), "team/y": gpus(0, 10), "other": gpus(0, 10)}
    found = fairshare.compute(pools, usage, TOTAL)
    assert found.pools["team"].fair_share == pytest.approx(0.5)
    # team's 0.5 among x (1), y (2) and its own jobs (1)
    assert found.pools["team/x"].fair_share == pytest.approx(0.125)
    assert found.pools["team/y"].fair_share == pytest.approx(0.25)
    assert found.own["team"].fair_share == pytest.approx(0.125)
    assert found.own["team/x"] == found.pools["team/x"], "a pool without children: its own part is all of it"
    # the subtree's usage counts the own jobs and the children's; the own part only the own jobs
    usage["team"] = gpus(1, 9)
    usage["team/x"] = gpus(2, 8)
    found = fairshare.compute(pools, usage, TOTAL)
    assert found.pools["team"].usage[0] == pytest.approx(0.3)
    assert found.own["team"].usage[0] == pytest.approx(0.1)
    # a pool with children and no own jobs gives them nothing
    del usage["team"]
    found = fairshare.compute(pools, usage, TOTAL)
    assert found.own["team"].fair_share == 0.0
    assert found.pools["team/x"].fair_share == pytest.approx(0.5 / 3)


def test_a_job_pool_not_configured_counts_as_a_default_pool_under_its_ancestor() -> None:
    pools = tree(team=PoolSettings(), other=PoolSettings())
    found = shares(pools, {"team/new": gpus(0, 10), "other": gpus(0, 10)})
    assert found == pytest.approx({"team": 0.5, "team/new": 0.5, "other": 0.5})


def test_dominant_resource_a_cpu_heavy_and_a_gpu_heavy_pool_get_equal_dominant_shares() -> None:
    usage = {
        "cpu": PoolUsage(demand=Resources(gpus=1, cpus=100)),  # CPU dominant: 1.0 of CPUs, 0.1 of GPUs
        "gpu": PoolUsage(demand=Resources(gpus=10, cpus=10)),  # GPU dominant
    }
    found = fairshare.compute(tree(), usage, TOTAL)
    cpu, gpu = found.pools["cpu"], found.pools["gpu"]
    assert cpu.fair_share == pytest.approx(0.5) and gpu.fair_share == pytest.approx(0.5)
    # per resource, the demand's shape scaled to the dominant share
    assert cpu.fair == pytest.approx((0.05, 0.5, 0.0))
    assert gpu.fair == pytest.approx((0.5, 0.05, 0.0))
    # a CPU-light GPU pool beside a CPU pool asking for little: the GPU pool gets all it asks for
    usage = {
        "cpu": PoolUsage(demand=Resources(cpus=20)),
        "gpu": PoolUsage(demand=Resources(gpus=10, cpus=10)),
    }
    found = fairshare.compute(tree(), usage, TOTAL)
    assert found.pools["cpu"].fair_share == pytest.approx(0.2)
    assert found.pools["gpu"].fair_share == pytest.approx(0.8)


@st.composite
def water_fills(draw: st.DrawFn) -> tuple[list[Claim], float]:
    """1-6 claims: caps of 0, between 0 and 1, or 1; guarantees of 0 (mostly) or up to 0.5,
    never above the cap; weights 0.5-3; and the amount given, all or a part."""
    rng = Drawn(draw)
    claims = []
    for _ in range(rng.randint(1, 6)):
        upper = rng.choice([0.0, rng.uniform(0, 1), 1.0])
        lower = min(upper, rng.choice([0.0, 0.0, rng.uniform(0, 0.5)]))
        claims.append(Claim(rng.choice([0.5, 1.0, 2.0, 3.0]), lower, upper))
    return claims, rng.choice([1.0, rng.uniform(0, 1)])


def shapes_of_water_fill(case: tuple[list[Claim], float]) -> list[str]:
    claims, given = case
    shapes = []
    if len(claims) >= 3:
        shapes.append("three claims or more")
    if any(claim.upper == 0 for claim in claims):
        shapes.append("a claim capped at 0")
    if any(0 < claim.upper < 1 for claim in claims):
        shapes.append("a claim capped between 0 and 1")
    if any(claim.lower > 0 for claim in claims):
        shapes.append("a guarantee")
    if sum(claim.lower for claim in claims) > given:
        shapes.append("guarantees adding up to more than is given")
    if sum(claim.upper for claim in claims) < given:
        shapes.append("caps adding up to less than is given")
    if given < 1:
        shapes.append("part of the whole given")
    if len({claim.weight for claim in claims}) >= 2:
        shapes.append("different weights")
    return shapes


def test_the_water_fill_generator_has_every_shape_the_property_claims() -> None:
    claimed = [
        "three claims or more",
        "a claim capped at 0",
        "a claim capped between 0 and 1",
        "a guarantee",
        "guarantees adding up to more than is given",
        "caps adding up to less than is given",
        "part of the whole given",
        "different weights",
    ]
    seen = shapes_drawn(water_fills(), shapes_of_water_fill, 100)
    assert not missing_shapes(seen, claimed), (missing_shapes(seen, claimed), seen)


@examples(100)
@given(water_fills())
def test_water_fill_properties(case: tuple[list[Claim], float]) -> None:
    """Shares add up to what is given (or to every cap when those add up to less); each is within
    its cap; each gets at least its guarantee (scaled down when the guarantees add up to more than
    what is given); above their guarantees and below their caps, shares are in proportion to
    the weights."""
    claims, given = case
    for shape in shapes_of_water_fill(case):
        event(shape)
    found = water_fill(claims, given)
    target = min(given, sum(claim.upper for claim in claims))
    assert sum(found) == pytest.approx(target, abs=1e-9)
    lowers = sum(claim.lower for claim in claims)
    scale = min(1.0, target / lowers) if lowers > 0 else 1.0
    for claim, share in zip(claims, found, strict=True):
        assert share <= claim.upper + 1e-9
        assert share >= claim.lower * scale - 1e-9
    free = [
        share / claim.weight
        for claim, share in zip(claims, found, strict=True)
        if claim.lower + 1e-6 < share < claim.upper - 1e-6
    ]
    if free:
        assert max(free) == pytest.approx(min(free), rel=1e-6)
    for claim, share in zip(claims, found, strict=True):
        if share < claim.upper - 1e-6 and share > claim.lower + 1e-6 and free:
            # a claim held under its cap is on the common level; one at its cap is at or under it
            assert share / claim.weight == pytest.approx(max(free), rel=1e-6)


# --- below fair share (B.3) ----------------------------------------------------------------------


def test_below_fair_share_is_usage_under_tolerance_times_fair_share() -> None:
    fair, demand = (0.5, 0.0, 0.0), (0.8, 0.0, 0.0)
    assert fairshare.below_fair_share((0.3, 0.0, 0.0), fair, demand, 0.8)
    assert not fairshare.below_fair_share((0.45, 0.0, 0.0), fair, demand, 0.8)
    assert fairshare.below_fair_share((0.45, 0.0, 0.0), fair, demand, 1.0)


def test_a_pool_exactly_at_tolerance_times_fair_share_is_not_below_it() -> None:
    fair, demand = (0.5, 0.0, 0.0), (1.0, 0.0, 0.0)
    assert not fairshare.below_fair_share((0.4, 0.0, 0.0), fair, demand, 0.8)
    assert fairshare.below_fair_share((0.39, 0.0, 0.0), fair, demand, 0.8)
    # through compute: two equal pools on 10 GPUs, fair share 5 each, tolerance 0.8 -> 4 GPUs
    found = fairshare.compute(tree(), {"a": gpus(4, 6), "b": gpus(6, 4)}, TOTAL)
    assert not found.pools["a"].below
    found = fairshare.compute(tree(), {"a": gpus(3, 7), "b": gpus(7, 3)}, TOTAL)
    assert found.pools["a"].below and not found.pools["b"].below


def test_the_bound_is_capped_at_demand() -> None:
    # on 10 GPUs with tolerance 1.0: a pool asking for exactly what it holds is never below
    assert not fairshare.below_fair_share((0.2, 0.0, 0.0), (0.2, 0.0, 0.0), (0.2, 0.0, 0.0), 1.0)
    assert not fairshare.below_fair_share((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), 0.8)


def test_below_only_if_under_on_every_resource_whose_demand_is_not_covered() -> None:
    # GPU and CPU both open (fair < demand): under on GPUs but not on CPUs -> not below
    fair, demand = (0.5, 0.5, 0.0), (1.0, 1.0, 0.0)
    assert not fairshare.below_fair_share((0.1, 0.45, 0.0), fair, demand, 0.8)
    assert fairshare.below_fair_share((0.1, 0.3, 0.0), fair, demand, 0.8)


def test_a_blocked_resource_does_not_count() -> None:
    # CPU demand covered by the fair share (blocked): only GPUs decide
    fair, demand = (0.5, 0.1, 0.0), (1.0, 0.1, 0.0)
    assert fairshare.below_fair_share((0.1, 0.1, 0.0), fair, demand, 0.8)
    assert not fairshare.below_fair_share((0.45, 0.0, 0.0), fair, demand, 0.8)


def test_when_every_resource_is_blocked_under_on_any_is_below() -> None:
    fair = demand = (0.3, 0.2, 0.0)
    assert fairshare.below_fair_share((0.3, 0.1, 0.0), fair, demand, 0.8)
    assert not fairshare.below_fair_share((0.3, 0.2, 0.0), fair, demand, 0.8)


# --- starvation timers (B.4) ------------------------------------------------------------------


POOL = Pool(path="a", parent=None, starvation_timeout_s=30.0, aggressive_starvation_timeout_s=120.0)
AGGRESSIVE = Pool(
    path="a",
    parent=None,
    starvation_timeout_s=30.0,
    aggressive_starvation_timeout_s=120.0,
    enable_aggressive_starvation=True,
)


def run_timer(pool: Pool, below: list[tuple[float, bool]]) -> list[StarvationState]:
    state, states = NOT_STARVING, []
    for now, is_below in below:
        state = fairshare.starvation(state, is_below, pool, now)
        states.append(state)
    return states


def test_the_timer_starts_when_a_pool_goes_below_its_fair_share() -> None:
    (state,) = run_timer(POOL, [(100.0, True)])
    assert state == StarvationState(Starvation.NON_STARVING, 100.0, None)


def test_a_pool_below_for_the_starvation_timeout_is_starving() -> None:
    states = run_timer(POOL, [(100.0, True), (110.0, True), (129.5, True), (130.5, True), (200.0, True)])
    assert [state.status for state in states] == [Starvation.NON_STARVING] * 3 + [Starvation.STARVING] * 2
    assert all(state.below_since == 100.0 for state in states)
    assert states[3].since == 130.5, "since: when it started starving"
    assert states[4].since == 130.5, "still starving: since does not move"


def test_aggressive_starvation_only_where_enabled() -> None:
    plain = run_timer(POOL, [(0.0, True), (30.5, True), (500.0, True)])
    assert plain[-1].status == Starvation.STARVING
    enabled = run_timer(AGGRESSIVE, [(0.0, True), (30.5, True), (119.0, True), (120.5, True), (130.0, True)])
    assert [state.status for state in enabled] == [
        Starvation.NON_STARVING,
        Starvation.STARVING,
        Starvation.STARVING,
        Starvation.AGGRESSIVELY_STARVING,
        Starvation.AGGRESSIVELY_STARVING,
    ]
    assert enabled[3].since == 120.5 and enabled[4].since == 120.5


def test_back_to_normal_resets_the_timer() -> None:
    states = run_timer(
        POOL, [(0.0, True), (40.0, True), (41.0, False), (42.0, True), (60.0, True), (72.5, True)]
    )
    assert states[1].status == Starvation.STARVING
    assert states[2] == NOT_STARVING
    assert states[3] == StarvationState(Starvation.NON_STARVING, 42.0, None)
    assert states[4].status == Starvation.NON_STARVING, "18 s since it went below again"
    assert states[5].status == Starvation.STARVING and states[5].since == 72.5


def test_timers_and_switches_are_inherited_down_the_tree() -> None:
    pools = resolve(
        {
            "t": PoolSettings(starvation_timeout_s=10.0, enable_aggressive_starvation=True),
            "t/x": PoolSettings(),
            "t/y": PoolSettings(starvation_timeout_s=50.0, aggressive_starvation_timeout_s=60.0),
        },
        PoolDefaults(aggressive_starvation_timeout_s=100.0),
    )
    assert pools["t/x"].starvation_timeout_s == 10.0 and pools["t/x"].enable_aggressive_starvation
    assert pools["t/x"].aggressive_starvation_timeout_s == 100.0
    states = run_timer(pools["t/y"], [(0.0, True), (49.0, True), (50.5, True), (60.5, True)])
    assert [state.status for state in states] == [
        Starvation.NON_STARVING,
        Starvation.NON_STARVING,
        Starvation.STARVING,
        Starvation.AGGRESSIVELY_STARVING,
    ]


def test_update_starvation_keeps_only_pools_with_a_timer_running() -> None:
    pools = tree(a=PoolSettings(), b=PoolSettings())
    found = fairshare.compute(pools, {"a": gpus(1, 9), "b": gpus(9, 1)}, TOTAL)
    first = fairshare.update_starvation({}, found, pools, 100.0)
    assert first == {"a": StarvationState(Starvation.NON_STARVING, 100.0, None)}
    later = fairshare.update_starvation(first, found, pools, 131.0)
    assert later["a"].status == Starvation.STARVING
    even = fairshare.compute(pools, {"a": gpus(5, 5), "b": gpus(5, 5)}, TOTAL)
    assert fairshare.update_starvation(later, even, pools, 132.0) == {}


def test_cycle_state_moves_the_timers_on() -> None:
    pools = tree(a=PoolSettings(), b=PoolSettings())
    usage = {"a": gpus(0, 10), "b": gpus(10, 0)}
    state = fairshare.cycle_state(pools, usage, TOTAL, {}, 0.0)
    assert not state.anyone_starving()
    state = fairshare.cycle_state(pools, usage, TOTAL, dict(state.starvation), 30.5)
    assert state.anyone_starving() and state.starvation["a"].status == Starvation.STARVING


# --- the prefix rule (B.5) --------------------------------------------------------------------

HUNDRED = Resources(gpus=100, cpus=100, memory_mb=1000)


def leaf(fair_gpus: float, demand_gpus: float = 1.0) -> PoolShare:
    return PoolShare("a", fair_gpus, (fair_gpus, 0.0, 0.0), (0.0, 0.0, 0.0), (demand_gpus, 0.0, 0.0), 0.8)


def test_b5_worked_example_fs_point_3_eight_allocations_of_point_05() -> None:
    allocations = [(f"a{index}", Resources(gpus=5)) for index in range(1, 9)]
    groups = fairshare.preemptible_groups(allocations, leaf(0.30), HUNDRED, 0.2, 1.0)
    NP, AP, P = Group.NON_PREEMPTIBLE, Group.AGGRESSIVELY_PREEMPTIBLE, Group.PREEMPTIBLE
    assert [groups[f"a{index}"] for index in range(1, 9)] == [NP, NP, AP, AP, AP, AP, P, P]


def test_the_allocation_that_crosses_a_bound_is_in_the_less_preemptible_group() -> None:
    # fs 0.30: a 0.25 allocation then a 0.10 one (crosses 0.30) then a 0.05 one
    allocations = [("old", Resources(gpus=25)), ("crossing", Resources(gpus=10)), ("new", Resources(gpus=5))]
    groups = fairshare.preemptible_groups(allocations, leaf(0.30), HUNDRED, 0.2, 1.0)
    assert groups == {
        "old": Group.NON_PREEMPTIBLE,
        "crossing": Group.AGGRESSIVELY_PREEMPTIBLE,
        "new": Group.PREEMPTIBLE,
    }
    # one large allocation over the whole share: non-preemptible, whatever its size
    groups = fairshare.preemptible_groups([("huge", Resources(gpus=90))], leaf(0.30), HUNDRED, 0.2, 1.0)
    assert groups == {"huge": Group.NON_PREEMPTIBLE}


@st.composite
def prefix_cases(draw: st.DrawFn) -> tuple[float, list[int]]:
    """A fair share of 0.05-0.6 of 100 GPUs and 1-12 allocations of 1, 2, 4 or 8 GPUs, oldest first."""
    rng = Drawn(draw)
    fair = rng.uniform(0.05, 0.6)
    return fair, [rng.choice([1, 2, 4, 8]) for _ in range(rng.randint(1, 12))]


def test_the_prefix_generator_draws_preemptible_and_non_preemptible_allocations() -> None:
    def shapes(case: tuple[float, list[int]]) -> list[str]:
        fair, sizes = case
        allocations = [(f"a{index}", Resources(gpus=size)) for index, size in enumerate(sizes)]
        return [
            group.name
            for group in fairshare.preemptible_groups(allocations, leaf(fair), HUNDRED, 0.2, 1.0).values()
        ]

    seen = shapes_drawn(prefix_cases(), shapes, 100)
    assert not missing_shapes(seen, [group.name for group in Group]), seen


@examples(100)
@given(prefix_cases())
def test_the_prefix_rule_leaves_at_least_threshold_times_fair_share_after_the_preemptible_go(
    case: tuple[float, list[int]],
) -> None:
    fair, sizes = case
    allocations = [(f"a{index}", Resources(gpus=size)) for index, size in enumerate(sizes)]
    groups = fairshare.preemptible_groups(allocations, leaf(fair), HUNDRED, 0.2, 1.0)
    order = [groups[key] for key, _ in allocations]
    assert order == sorted(order), "oldest first: NP, then AP, then P"
    kept = sum(
        size for (key, _), size in zip(allocations, sizes, strict=True) if groups[key] != Group.PREEMPTIBLE
    )
    if Group.PREEMPTIBLE in order:
        assert kept / 100 >= fair - 1e-12
    not_np = sum(
        size
        for (key, _), size in zip(allocations, sizes, strict=True)
        if groups[key] == Group.NON_PREEMPTIBLE
    )
    assert not_np > 0, "the oldest allocation is never preemptible"


def test_allow_aggressive_preemption_false_turns_aggressively_preemptible_into_non_preemptible() -> None:
    pools = {
        "a": Pool(path="a", parent=None, allow_aggressive_preemption=False),
        "b": Pool(path="b", parent=None),
    }
    total = Resources(gpus=40, cpus=100, memory_mb=1000)
    usage = {"a": gpus(8 * 2, 0), "b": gpus(8 * 2, 24)}
    state = FairShareState(fairshare.compute(pools, usage, total), {}, pools)
    # a and b: fair share 0.3 each... a asks for 16 of 40 (0.4); b for 40 (1.0): a 0.4, b 0.6
    units = [(f"{pool}{index}", pool, float(index), Resources(gpus=2)) for pool in "ab" for index in range(8)]
    groups = fairshare.preemptible_units(units, state, 0.2, 1.0)
    a_groups = {groups[f"a{index}"] for index in range(8)}
    assert Group.AGGRESSIVELY_PREEMPTIBLE not in a_groups and Group.NON_PREEMPTIBLE in a_groups
    b_groups = [groups[f"b{index}"] for index in range(8)]
    assert Group.AGGRESSIVELY_PREEMPTIBLE in b_groups


def test_preemptible_units_orders_a_pools_allocations_oldest_first() -> None:
    pools = tree(a=PoolSettings(), b=PoolSettings())
    usage = {"a": gpus(8, 0), "b": gpus(0, 8)}
    state = FairShareState(fairshare.compute(pools, usage, TOTAL), {}, pools)
    # given newest first: the groups still follow the start times
    units = [(f"a{index}", "a", 100.0 - index, Resources(gpus=1)) for index in range(8)]
    groups = fairshare.preemptible_units(units, state, 0.2, 1.0)
    # fs of a: 0.5 (5 GPUs): the oldest (a7) is non-preemptible, a0 (newest) preemptible
    assert groups["a7"] == Group.NON_PREEMPTIBLE
    assert groups["a0"] == Group.PREEMPTIBLE and groups["a1"] == Group.PREEMPTIBLE
    assert groups["a2"] == Group.PREEMPTIBLE, (
        "the oldest five hold 5 GPUs: the share; the rest are preemptible"
    )
    assert groups["a3"] == Group.AGGRESSIVELY_PREEMPTIBLE


# --- the plan's books -------------------------------------------------------------------------


def starving(since: float = 0.0, aggressive: bool = False) -> StarvationState:
    status = Starvation.AGGRESSIVELY_STARVING if aggressive else Starvation.STARVING
    return StarvationState(status, since, since)


def books(
    pools: dict[str, Pool],
    usage: dict[str, PoolUsage],
    starvation: dict[str, StarvationState],
    total: Resources = TOTAL,
) -> Books:
    return Books(FairShareState(fairshare.compute(pools, usage, total), starvation, pools))


def test_may_never_take_from_inside_the_beneficiarys_subtree() -> None:
    pools = tree(t__x=PoolSettings(), t__y=PoolSettings(), o=PoolSettings())
    usage = {"t/x": gpus(1, 9), "t/y": gpus(1, 9), "o": gpus(8, 2)}
    account = books(pools, usage, {"t": starving()})
    assert not account.may_take_from("t/x", "t", False, (0.2, 1.0))
    assert not account.may_take_from("t", "t", False, (0.2, 1.0))
    assert account.may_take_from("o", "t", False, (0.2, 1.0))


def test_may_take_from_a_sibling_over_its_share_but_not_one_under_its_threshold() -> None:
    pools = tree(a=PoolSettings(), b=PoolSettings())
    account = books(pools, {"a": gpus(2, 8), "b": gpus(8, 2)}, {"a": starving()})
    assert account.beneficiary("a", aggressive=False) == "a"
    assert account.may_take_from("b", "a", False, (0.2, 1.0))
    # b at 4 of its fair share 5 is under threshold 1.0: not in the regular stage; it is over the
    # aggressive threshold 0.2
    account = books(pools, {"a": gpus(2, 8), "b": gpus(4, 6)}, {"a": starving(aggressive=True)})
    assert not account.may_take_from("b", "a", False, (0.2, 1.0))
    assert account.may_take_from("b", "a", True, (0.2, 1.0))
    # unless b does not allow aggressive preemption
    strict = {**pools, "b": Pool(path="b", parent=None, allow_aggressive_preemption=False)}
    account = books(strict, {"a": gpus(2, 8), "b": gpus(4, 6)}, {"a": starving(aggressive=True)})
    assert not account.may_take_from("b", "a", True, (0.2, 1.0))


def test_a_pool_exactly_at_its_threshold_may_be_taken_from() -> None:
    pools = tree(a=PoolSettings(), b=PoolSettings())
    account = books(pools, {"a": gpus(2, 8), "b": gpus(5, 5)}, {"a": starving()})
    assert account.may_take_from("b", "a", False, (0.2, 1.0))


def test_a_take_that_would_leave_the_pool_under_its_threshold_is_refused() -> None:
    pools = tree(a=PoolSettings(), b=PoolSettings())
    account = books(pools, {"a": gpus(2, 8), "b": gpus(6, 4)}, {"a": starving()})
    assert account.may_take_from("b", "a", False, (0.2, 1.0), Resources(gpus=1)), "b left at its share"
    assert not account.may_take_from("b", "a", False, (0.2, 1.0), Resources(gpus=2)), "b left at 4 of 5"
    account = books(pools, {"a": gpus(2, 8), "b": gpus(6, 4)}, {"a": starving(aggressive=True)})
    assert account.may_take_from("b", "a", True, (0.2, 1.0), Resources(gpus=5)), "b left at 0.2 of its share"
    assert not account.may_take_from("b", "a", True, (0.2, 1.0), Resources(gpus=6))


def test_a_take_that_would_leave_an_ancestor_under_its_threshold_is_refused() -> None:
    """t at its fair share (5), x over its own (3 of 2.5), y under it but not starving: taking x's
    newest allocation for o would leave t at 4 of 5, below 0.8 x its share (found by the stability
    property: the check was made on the usage before the take)."""
    pools = tree(t__x=PoolSettings(), t__y=PoolSettings(), o=PoolSettings())
    usage = {"t/x": gpus(3, 0), "t/y": gpus(2, 10), "o": gpus(3, 7)}
    account = books(pools, usage, {"o": starving()})
    assert account.state.shares.pools["t"].fair_share == pytest.approx(0.5)
    assert not account.may_take_from("t/x", "o", False, (0.2, 1.0), Resources(gpus=1))


def test_a_starving_pool_on_the_way_up_blocks_the_take() -> None:
    pools = tree(t__x=PoolSettings(), t__y=PoolSettings(), o=PoolSettings())
    usage = {"t/x": gpus(6, 0), "t/y": gpus(0, 10), "o": gpus(2, 8)}
    # o is starving: x, over its share inside t, may be taken from for o ...
    account = books(pools, usage, {"o": starving()})
    assert account.may_take_from("t/x", "o", False, (0.2, 1.0))
    # ... but not while t/y, its sibling, is starving? No: y is not on the way from x up to the
    # root; t is. A starving t blocks.
    account = books(pools, usage, {"o": starving(), "t": starving()})
    assert not account.may_take_from("t/x", "o", False, (0.2, 1.0))
    # a starving victim pool itself blocks
    account = books(pools, usage, {"o": starving(), "t/x": starving()})
    assert not account.may_take_from("t/x", "o", False, (0.2, 1.0))


def test_an_ancestor_under_its_threshold_blocks_the_take_but_the_common_ancestor_does_not() -> None:
    pools = tree(t__x=PoolSettings(), t__y=PoolSettings(), o=PoolSettings())
    # t holds 4 of its fair share 5 (x over its 2.5, y under): under threshold 1.0
    usage = {"t/x": gpus(4, 0), "t/y": gpus(0, 10), "o": gpus(6, 4)}
    account = books(pools, usage, {"o": starving()})
    assert not account.may_take_from("t/x", "o", False, (0.2, 1.0))
    # inside t, y starving may take from x: t is the common ancestor and does not block
    account = books(pools, usage, {"t/y": starving()})
    assert account.may_take_from("t/x", "t/y", False, (0.2, 1.0))


def test_books_follow_the_moves_of_the_plan() -> None:
    pools = tree(a=PoolSettings(), b=PoolSettings())
    account = books(pools, {"a": gpus(2, 8), "b": gpus(8, 2)}, {"a": starving()})
    assert account.beneficiary("a", aggressive=False) == "a"
    assert account.beneficiary("a", aggressive=True) is None, "starving, not aggressively"
    assert account.beneficiary("b", aggressive=False) is None
    # a 2-GPU move from b to a brings a to 4 of 5 (tolerance 0.8): not below any more
    account.add("b", Resources(gpus=2), sign=-1)
    account.add("a", Resources(gpus=2))
    assert account.beneficiary("a", aggressive=False) is None
    assert account.may_take_from("b", "a", False, (0.2, 1.0))
    account.add("b", Resources(gpus=2), sign=-1)
    assert not account.may_take_from("b", "a", False, (0.2, 1.0)), "b at 4 of 5: under threshold 1.0"


def test_beneficiary_is_the_lowest_starving_pool_on_the_path() -> None:
    pools = tree(t__x=PoolSettings(), o=PoolSettings())
    usage = {"t/x": gpus(1, 9), "o": gpus(9, 1)}
    account = books(pools, usage, {"t": starving(), "t/x": starving()})
    assert account.beneficiary("t/x", aggressive=False) == "t/x"
    account = books(pools, usage, {"t": starving(aggressive=True)})
    assert account.beneficiary("t/x", aggressive=False) == "t"
    assert account.beneficiary("t/x", aggressive=True) == "t"


# --- what ``why`` and the planner say ------------------------------------------------------------


def test_describe_names_the_pool_its_share_its_usage_and_the_timer() -> None:
    pools = tree(a=PoolSettings(), b=PoolSettings())
    shares_now = fairshare.compute(pools, {"a": gpus(2, 8), "b": gpus(8, 2)}, TOTAL)
    timer = StarvationState(Starvation.NON_STARVING, 100.0, None)
    state = FairShareState(shares_now, {"a": timer}, pools)
    words = fairshare.describe("a", state, now=110.0)
    assert words.startswith("pool a:")
    assert "fair share 50.0%" in words and "5.0 GPUs" in words
    assert "using 20.0%" in words and "2 GPUs" in words
    assert "for 10 s" in words and "starving after 30 s" in words
    words = fairshare.describe("a", FairShareState(shares_now, {"a": starving(100.0)}, pools), now=140.0)
    assert "starving" in words and "for 40 s" in words
    assert "not below its fair share" in fairshare.describe("b", state)
    assert "no fair share yet" in fairshare.describe("nowhere", state)


def test_explain_names_the_lowest_pool_on_the_path_with_a_timer() -> None:
    pools = tree(t__x=PoolSettings(), o=PoolSettings())
    found = fairshare.compute(pools, {"t/x": gpus(1, 9), "o": gpus(9, 1)}, TOTAL)
    state = FairShareState(found, {"t": StarvationState(Starvation.NON_STARVING, 5.0, None)}, pools)
    reason = fairshare.explain("t/x", state, 20.0)
    assert reason is not None and reason.code == "fair_share"
    assert reason.message.startswith("pool t:") and "for 15 s" in reason.message
    assert fairshare.explain("o", state, 20.0) is None
