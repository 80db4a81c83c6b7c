"""``--out DIR``: ``report.html`` (one self-contained page, the figures inlined) and its PNGs.

Figures: the queueing-delay CDF per policy (and production's, for a trace that has it), GPU
allocation over time, each pool's share of the cluster over time against its fair share (the first
policy's run), preemptions over time. matplotlib is an optional dependency (the ``sim`` extra),
imported here only.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from corral.sim.compare import table
from corral.sim.engine import Record
from corral.sim.summary import allocation_series, delays_of, fair_shares, production_series
from corral.sim.workload import Scenario

#: pools drawn in the share figure, at most (the largest fair shares)
SHARE_POOLS = 8
POINTS = 400


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("corral sim --out needs matplotlib: pip install 'corral[sim]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def write(
    out: Path, scenario: Scenario, records: Mapping[str, Record], summaries: Sequence[Mapping[str, Any]]
) -> Path:
    pyplot = _pyplot()
    hours = 3600.0
    figures: list[tuple[str, str, str]] = []  # (file, title, caption)

    # 1. queueing-delay CDF
    figure, axes = pyplot.subplots(figsize=(7, 4))
    curves = {name: delays_of(scenario, record) for name, record in records.items()}
    production = [
        job.production_start - job.submit_time
        for job in scenario.workload.jobs
        if job.production_start is not None
    ]
    if production:
        curves = {"production": production, **curves}
    for name, values in curves.items():
        ordered = sorted(max(value, 0.5) for value in values)
        if ordered:
            axes.step(
                ordered,
                [(index + 1) / len(ordered) for index in range(len(ordered))],
                where="post",
                label=name,
            )
    axes.set_xscale("log")
    axes.set_xlabel("queueing delay (s, log; 0 shown at 0.5 s)")
    axes.set_ylabel("fraction of jobs")
    axes.grid(alpha=0.3)
    axes.legend()
    figures.append(_save(pyplot, figure, out, "queue_delay_cdf.png", "Queueing delay, CDF per policy", ""))

    # 2. allocation over time
    gpus = scenario.cluster.gpus
    figure, axes = pyplot.subplots(figsize=(9, 3.5))
    if production:
        series = production_series(scenario)
        axes.step(*_columns(series, hours, gpus), where="post", label="production", alpha=0.7)
    for name, record in records.items():
        axes.step(*_columns(allocation_series(record), hours, gpus), where="post", label=name, alpha=0.8)
    axes.set_xlabel("time (h)")
    axes.set_ylabel("GPUs allocated (fraction)")
    axes.grid(alpha=0.3)
    axes.legend()
    figures.append(_save(pyplot, figure, out, "gpu_allocation.png", "GPU allocation over time", ""))

    # 3. per-pool share over time against the fair share (first policy)
    first_name, first = next(iter(records.items()))
    pools = sorted({job.pool for job in scenario.workload.jobs})
    shares = fair_shares(scenario, pools)
    shown = sorted(pools, key=lambda path: (-shares[path], path))[:SHARE_POOLS]
    figure, axes = pyplot.subplots(figsize=(9, 4))
    end = max((at for at, _, _ in first.allocation), default=0.0)
    grid = [end * index / POINTS for index in range(POINTS + 1)]
    held: dict[str, float] = dict.fromkeys(pools, 0.0)
    samples: dict[str, list[float]] = {path: [] for path in shown}
    changes = iter(first.allocation)
    pending = next(changes, None)
    for at in grid:
        while pending is not None and pending[0] <= at:
            held[pending[1]] += pending[2]
            pending = next(changes, None)
        for path in shown:
            samples[path].append(held[path] / gpus)
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, path in enumerate(shown):
        colour = colours[index % len(colours)]
        axes.plot([at / hours for at in grid], samples[path], color=colour, label=path)
        axes.axhline(shares[path], color=colour, linestyle="--", linewidth=0.8)
    axes.set_xlabel("time (h)")
    axes.set_ylabel("share of the cluster's GPUs")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", ncol=2)
    caption = (
        f"{first_name}: solid, the pool's share held; dashed, its fair share ({len(shown)} largest pools)"
    )
    figures.append(_save(pyplot, figure, out, "pool_share.png", "Per-pool share over time", caption))

    # 4. preemptions over time
    figure, axes = pyplot.subplots(figsize=(9, 3))
    horizon = max((entry[0] for record in records.values() for entry in record.preemptions), default=0.0)
    bins = max(1, min(100, math.ceil(horizon / hours)))
    for name, record in records.items():
        times = [entry[0] / hours for entry in record.preemptions]
        if times:
            axes.hist(times, bins=bins, alpha=0.6, label=f"{name} ({len(times)})")
    axes.set_xlabel("time (h)")
    axes.set_ylabel("preemptions")
    axes.grid(alpha=0.3)
    if any(record.preemptions for record in records.values()):
        axes.legend()
    figures.append(_save(pyplot, figure, out, "preemptions.png", "Preemptions over time", ""))

    # 5. racks spanned per gang, by its host count (clusters with rack labels: issue 25)
    spreads = {s["policy"]: s["gang_spread"] for s in summaries if s.get("gang_spread", {}).get("by_hosts")}
    if spreads:
        figure, axes = pyplot.subplots(figsize=(7, 4))
        for name, spread in spreads.items():
            hosts = [int(key) for key in spread["by_hosts"]]
            axes.plot(
                hosts, [row["mean_racks"] for row in spread["by_hosts"].values()], marker="o", label=name
            )
        first_spread = next(iter(spreads.values()))
        hosts = [int(key) for key in first_spread["by_hosts"]]
        fewest = [row["mean_fewest_racks"] for row in first_spread["by_hosts"].values()]
        axes.plot(hosts, fewest, linestyle="--", color="grey", label="fewest possible")
        axes.set_xlabel("hosts of the gang")
        axes.set_ylabel("racks spanned (mean)")
        axes.grid(alpha=0.3)
        axes.legend()
        figures.append(
            _save(pyplot, figure, out, "gang_spread.png", "Racks spanned per gang", "each gang's first start")
        )

    page = out / "report.html"
    page.write_text(_page(out, scenario, summaries, figures), encoding="utf-8")
    return page


def _columns(
    series: Sequence[tuple[float, float]], hours: float, gpus: int
) -> tuple[list[float], list[float]]:
    if not series:
        return [0.0], [0.0]
    step = max(1, len(series) // 20000)  # a figure needs no more points than pixels
    kept = series[::step]
    return [at / hours for at, _ in kept], [held / gpus for _, held in kept]


def _save(pyplot: Any, figure: Any, out: Path, name: str, title: str, caption: str) -> tuple[str, str, str]:
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out / name, dpi=110)
    pyplot.close(figure)
    return name, title, caption


def _page(
    out: Path,
    scenario: Scenario,
    summaries: Sequence[Mapping[str, Any]],
    figures: Sequence[tuple[str, str, str]],
) -> str:
    headers, rows = table(summaries)
    summary_table = _html_table(headers, rows)
    pool_headers = ["pool", "fair share", "jobs", *(f"{s['policy']} p99 delay (s)" for s in summaries)]
    pool_headers += [f"{s['policy']} GPU-h" for s in summaries] + [f"{s['policy']} rho" for s in summaries]
    pool_headers += [f"{s['policy']} starved gangs" for s in summaries]
    pool_headers += [f"{s['policy']} starved within share" for s in summaries]
    pool_headers += [f"{s['policy']} gangs over the bound" for s in summaries]
    pool_rows = []
    for path, first in summaries[0]["pools"].items():
        row = [path, f"{100 * first['fair_share']:.1f}%", str(first["jobs"])]
        row += [_cell(s["pools"].get(path, {}).get("queue_delay_s", {}).get("p99")) for s in summaries]
        row += [_cell(s["pools"].get(path, {}).get("gpu_hours")) for s in summaries]
        row += [_cell(s["pools"].get(path, {}).get("rho")) for s in summaries]
        row += [_cell(s["pools"].get(path, {}).get("starved_gangs")) for s in summaries]
        row += [_cell(s["pools"].get(path, {}).get("starved_gangs_within_share")) for s in summaries]
        row += [_cell(s["pools"].get(path, {}).get("gangs_over_bound")) for s in summaries]
        pool_rows.append(row)
    images = "\n".join(
        f"<figure><img alt='{html.escape(title)}' src='data:image/png;base64,"
        f"{base64.b64encode((out / name).read_bytes()).decode()}'>"
        f"<figcaption>{html.escape(title)}{': ' + html.escape(caption) if caption else ''}"
        "</figcaption></figure>"
        for name, title, caption in figures
    )
    unscheduled = summaries[0].get("unscheduled_in_production")
    note = (
        f"<p>{unscheduled} trace jobs were never scheduled in production: not replayed.</p>"
        if unscheduled
        else ""
    )
    settings = html.escape(repr(scenario.settings))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>corral sim: {html.escape(scenario.workload.name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
img {{ max-width: 100%; }} figcaption {{ font-size: 0.85em; color: #555; }}
code {{ font-size: 0.85em; }}
</style></head><body>
<h1>corral sim: {html.escape(scenario.workload.name)} on {html.escape(scenario.cluster.name)}</h1>
<p>{len(scenario.workload.jobs)} jobs, {len(scenario.cluster.workers)} workers, {scenario.cluster.gpus} GPUs;
policies: {", ".join(html.escape(str(s["policy"])) for s in summaries)}.</p>
{note}
<h2>Summary</h2>
{summary_table}
<h2>Figures</h2>
{images}
<h2>Pools</h2>
<p>Light pools (asking no more than their fair share over the arrivals):
{html.escape(", ".join(summaries[0]["light_pools"]["pools"]) or "none")}.
Heavy pools: {html.escape(", ".join(summaries[0]["heavy_pools"]["pools"]) or "none")}.
A gang is over the bound when it waited longer than {summaries[0]["starvation_bound_s"] / 3600:g} h
or never started, and starved when it waited that long while its pool held less than its starvation
tolerance times its fair share (the time the scheduler owed its pool capacity), and starved within
share when, for that long, the gang itself also fitted in its pool's share (the pool's GPUs plus the
gang's at most the share: the capacity fair share owed the gang itself).</p>
{_html_table(pool_headers, pool_rows)}
{_gangs_section(summaries)}
{_spread_section(summaries)}
<h2>Settings</h2>
<p><code>{settings}</code></p>
</body></html>
"""


def _gangs_section(summaries: Sequence[Mapping[str, Any]]) -> str:
    """Every policy's gangs over the bound (longest wait first), with the time their pool was
    owed capacity, and the peak gang load that says whether any policy could start them all."""
    first = summaries[0]
    bound_h = first["starvation_bound_s"] / 3600
    load = first.get("peak_gang_load", 0.0)
    words = (
        f"<p>Peak gang load: {load:.2f} (the most GPU-time gangs asked for within {bound_h:g} h, as a"
        f" multiple of what the cluster runs in {bound_h:g} h)"
        + (
            ": above 1, the gangs of that window alone ask for more GPU-time than the whole cluster"
            " has in it, so some of them wait long behind the others whatever the policy."
            if load > 1
            else "."
        )
        + "</p>"
    )
    headers = [
        "policy", "gang", "pool", "tasks x GPUs", "submitted (h)", "waited (h)", "owed (h)", "starved",
        "owed a start (h)",
        "reservations (h: estimated start)",
    ]  # fmt: skip
    rows = [
        [
            str(summary["policy"]),
            gang["job_id"],
            gang["pool"],
            f"{gang['gang_size']} x {gang['gpus']}",
            f"{gang['submit_time'] / 3600:.1f}",
            "never started" if gang["queue_delay_s"] is None else f"{gang['queue_delay_s'] / 3600:.1f}",
            f"{gang['below_fair_share_s'] / 3600:.1f}",
            "yes" if gang["starved"] else "no",
            f"{gang.get('owed_start_s', 0.0) / 3600:.1f}",
            reservation_history(gang),
        ]
        for summary in summaries
        for gang in summary.get("gangs", ())
    ]
    table = _html_table(headers, rows) if rows else "<p>No gang waited past the bound.</p>"
    history = (
        "<p>Reservations: each time the gang's estimated start changed while it waited, the hour"
        " of the change and the estimated start (h) it got then; <em>none</em>: it lost its estimate"
        " (its room came to depend on work without a walltime, or other work came before it within"
        " the backfill depth).</p>"
    )
    return f"<h2>Gangs over the bound</h2>\n{words}\n{history}\n{table}"


def reservation_history(gang: Mapping[str, Any]) -> str:
    """A gang's reservation history: at each change, the hour and the estimated start it got
    then (none: it lost its estimate), the earlier ones counted when the summary kept only the
    last."""
    history = gang.get("reservations") or []
    if not history:
        return "never reserved"
    entries = [
        f"{at / 3600:.1f}: {'none' if start is None else f'{start / 3600:.1f}'}" for at, start in history
    ]
    earlier = gang.get("reservation_changes", len(history)) - len(history)
    return ("... " if earlier > 0 else "") + "; ".join(entries)


def _spread_section(summaries: Sequence[Mapping[str, Any]]) -> str:
    """The "gang spread" table (issue 25): per run, the racks and blocks its gangs spanned against
    the fewest racks their hosts fit in; empty on a cluster without rack labels."""
    rows = []
    for summary in summaries:
        spread = summary.get("gang_spread")
        if not spread or not spread.get("gangs"):
            continue
        multi = spread.get("multi_host") or {}
        rows.append(
            [
                str(summary["policy"]),
                str(spread["gangs"]),
                _cell(spread["mean_racks"]),
                _cell(spread["mean_fewest_racks"]),
                _cell(multi.get("ratio")),
                _cell(spread["mean_blocks"]),
                f"{spread['required_rack_split']} of {spread['required_rack_gangs']}",
            ]
        )
    if not rows:
        return ""
    headers = [
        "run",
        "gangs",
        "mean racks",
        "fewest racks",
        "racks / fewest (2+ hosts)",
        "mean blocks",
        "rack-required gangs split",
    ]
    return f"<h2>Gang spread</h2>\n{_html_table(headers, rows)}"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(header)}</th>" for header in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
