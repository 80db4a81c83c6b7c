"""Summaries side by side: the table ``corral sim`` prints and ``corral sim compare A.json B.json``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: (label, path into the summary); "production" columns read the same paths under "production"
ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("jobs", ("jobs",)),
    ("finished", ("finished",)),
    ("makespan (h)", ("makespan_s",)),
    ("queue delay p50 (s)", ("queue_delay_s", "p50")),
    ("queue delay p90 (s)", ("queue_delay_s", "p90")),
    ("queue delay p99 (s)", ("queue_delay_s", "p99")),
    ("queue delay mean (s)", ("queue_delay_s", "mean")),
    ("JCT p50 (s)", ("jct_s", "p50")),
    ("JCT p99 (s)", ("jct_s", "p99")),
    ("GPU allocation", ("gpu_allocation",)),
    ("GPU reserved", ("gpu_reserved",)),
    ("preemptions", ("preemptions",)),
    ("GPU-hours lost", ("gpu_hours_lost",)),
    ("starved gangs", ("starved_gangs",)),
    ("starved gangs within share", ("starved_gangs_within_share",)),
    ("gangs over the bound", ("gangs_over_bound",)),
    ("light pools: p99 delay (s)", ("light_pools", "queue_delay_s", "p99")),
    ("heavy pools: p99 delay (s)", ("heavy_pools", "queue_delay_s", "p99")),
    ("estimated starts", ("estimated_start", "jobs")),
    ("estimate error p50 (s)", ("estimated_start", "error_s", "p50")),
    ("estimate error p90 (s)", ("estimated_start", "error_s", "p90")),
    ("estimate error p50 / wait", ("estimated_start", "error_of_wait", "p50")),
    ("estimate error p90 / wait", ("estimated_start", "error_of_wait", "p90")),
)


def _get(summary: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = summary
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _format(label: str, value: Any) -> str:
    if value is None:
        return "-"
    if label.startswith("makespan"):
        return f"{value / 3600:.1f}"
    if label in ("GPU allocation", "GPU reserved") or label.endswith("/ wait"):
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) < 1e6 else f"{value:.3g}"
    return str(value)


def table(summaries: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: one column per summary, plus the trace's production figures where the
    first summary carries them; then each pool's p99 queueing delay and rho."""
    columns: list[tuple[str, Mapping[str, Any]]] = []
    production = summaries[0].get("production") if summaries else None
    if production:
        columns.append(("production", production))
    columns.extend(
        (str(summary.get("policy", f"run {index + 1}")), summary) for index, summary in enumerate(summaries)
    )
    headers = ["", *(name for name, _ in columns)]
    rows = [[label, *(_format(label, _get(summary, path)) for _, summary in columns)] for label, path in ROWS]
    pools = sorted({path for summary in summaries for path in summary.get("pools", {})})
    if len(pools) > 1:
        for pool in pools:
            rows.append(
                [
                    f"{pool}: p99 delay (s)",
                    *(
                        _format("", _get(summary, ("pools", pool, "queue_delay_s", "p99")))
                        for _, summary in columns
                    ),
                ]
            )
            rows.append(
                [
                    f"{pool}: rho",
                    *(_format("", _get(summary, ("pools", pool, "rho"))) for _, summary in columns),
                ]
            )
    return headers, rows
