"""``corral sim`` end to end on small files: the --json summary, --set, --policy, --out, compare."""

from __future__ import annotations

import io
import json
from dataclasses import fields
from pathlib import Path

import pytest

from corral.cli.main import main
from corral.config import ServerSettings, WorkerSettings
from corral.sim import readers
from corral.sim.workload import SimSettings

WORKLOAD = """job_id,submit_time,duration,gpus,gang_size,pool,preemption_class,checkpoint
a,0,100,2,1,batch,2,auto
b,1,50,1,1,batch,5,none
c,2,40,1,1,interactive,5,none
g,3,30,2,2,batch,5,none
h,10,30,1,1,interactive,8,none
"""
CLUSTER = "worker_id,gpus,cpus,memory_mb,count\nw,2,8,16000,2\n"
POOLS = '{"pools": {"batch": {"guarantee": {"gpus": 2}}, "interactive": {"guarantee": {"gpus": 2}}}}'


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    paths = {}
    for name, text in (("workload.csv", WORKLOAD), ("cluster.csv", CLUSTER), ("pools.json", POOLS)):
        (tmp_path / name).write_text(text)
        paths[name.split(".")[0]] = str(tmp_path / name)
    return paths


def simulate(capsys, *arguments: str) -> dict:
    assert main(["sim", *arguments, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_json_summary_has_the_documented_fields(files, capsys) -> None:
    summary = simulate(capsys, files["workload"], "--cluster", files["cluster"], "--pools", files["pools"])
    for key in ("jobs", "makespan_s", "queue_delay_s", "jct_s", "gpu_allocation", "preemptions"):
        assert key in summary
    assert set(summary["queue_delay_s"]) == {"p50", "p90", "p99", "mean"}
    assert summary["jobs"] == summary["finished"] == 5
    assert summary["preemptions"] == 1, "the class-8 job takes the class-2 job's GPUs"
    assert set(summary["pools"]) == {"batch", "interactive"}
    batch = summary["pools"]["batch"]
    assert {"queue_delay_s", "gpu_hours", "fair_share_gpu_hours", "rho"} <= set(batch)
    assert batch["fair_share"] == 0.5
    assert summary["starved_gangs"] == 0 and summary["gpu_hours_lost"] >= 0


def test_fifo_never_preempts(files, capsys) -> None:
    summary = simulate(capsys, files["workload"], "--cluster", files["cluster"], "--policy", "fifo")
    assert summary["policy"] == "fifo" and summary["preemptions"] == 0


def test_a_setting_is_changed_by_its_corral_name_and_checked_by_the_servers_rule(files, capsys) -> None:
    slow = simulate(
        capsys, files["workload"], "--cluster", files["cluster"], "--set", "CORRAL_ADMISSION_TICK_S=60"
    )
    fast = simulate(capsys, files["workload"], "--cluster", files["cluster"])
    assert slow["queue_delay_s"]["mean"] > fast["queue_delay_s"]["mean"], "gangs wait for the next tick"
    code = main(["sim", files["workload"], "--cluster", files["cluster"], "--set", "CORRAL_MAX_VICTIMS=0"])
    assert code == 2
    assert "CORRAL_MAX_VICTIMS=0" in capsys.readouterr().err
    assert main(["sim", files["workload"], "--cluster", files["cluster"], "--set", "CORRAL_NOPE=1"]) == 2
    assert "CORRAL_ADMISSION_TICK_S" in capsys.readouterr().err


def test_the_simulators_defaults_are_the_servers() -> None:
    server, worker = ServerSettings(), WorkerSettings()
    for field in fields(SimSettings):
        for settings in (server, worker):
            if field.name in type(settings).model_fields:
                assert getattr(settings, field.name) == field.default, field.name


def test_bad_input_stops_before_anything_runs(files, tmp_path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_time,duration,gpus\na,0,10,two\n")
    assert main(["sim", str(bad), "--cluster", files["cluster"], "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{bad}:2: column 4 (gpus)" in captured.err
    assert main(["sim", files["workload"]]) == 2
    assert "--cluster is required" in capsys.readouterr().err


def test_out_writes_the_report_and_compare_prints_two_summaries(files, tmp_path, capsys) -> None:
    out = tmp_path / "report"
    arguments = [files["workload"], "--cluster", files["cluster"], "--pools", files["pools"]]
    assert main(["sim", *arguments, "--policy", "corral,fifo", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "queue delay p99 (s)" in printed and "corral" in printed and "fifo" in printed
    for name in (
        "report.html",
        "queue_delay_cdf.png",
        "gpu_allocation.png",
        "pool_share.png",
        "preemptions.png",
    ):
        assert (out / name).stat().st_size > 0, name
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4, "one self-contained page"
    a, b = out / "summary-corral.json", out / "summary-fifo.json"
    assert main(["sim", "compare", str(a), str(b)]) == 0
    table = capsys.readouterr().out
    assert "summary-corral.json" in table and "summary-fifo.json" in table and "GPU allocation" in table


TRACES = Path("/work/shared/traces")


@pytest.mark.skipif(not TRACES.exists(), reason="the shared traces are not on this machine")
def test_generate_writes_a_multi_tenant_workload_the_simulator_reads(tmp_path, capsys) -> None:
    out = tmp_path / "generated"
    trace = str(TRACES / "alibaba-gpu-v2023" / "jobs.csv")
    quotas = str(TRACES / "helios-venus" / "cluster_gpu_number.csv")
    arguments = [
        "sim",
        "generate",
        str(out),
        "--trace",
        trace,
        "--quotas",
        quotas,
        "--jobs",
        "200",
        "--workers",
        "8",
    ]
    assert main(arguments) == 0
    assert "overloaded" in capsys.readouterr().out
    summary = simulate(
        capsys,
        str(out / "workload.csv"),
        "--cluster",
        str(out / "cluster.csv"),
        "--pools",
        str(out / "pools.json"),
    )
    assert summary["jobs"] == 200 and summary["cluster"]["gpus"] == 64
    assert len(summary["pools"]) > 10 and summary["light_pools"]["pools"]


@pytest.mark.skipif(not TRACES.exists(), reason="the shared traces are not on this machine")
def test_generate_with_a_walltime_factor_writes_the_walltimes_the_run_plans_with(tmp_path, capsys) -> None:
    out = tmp_path / "generated"
    trace = str(TRACES / "alibaba-gpu-v2023" / "jobs.csv")
    quotas = str(TRACES / "helios-venus" / "cluster_gpu_number.csv")
    arguments = ["sim", "generate", str(out), "--trace", trace, "--quotas", quotas]
    assert main([*arguments, "--jobs", "150", "--workers", "8", "--walltime-factor", "2"]) == 0
    capsys.readouterr()
    jobs = readers.read_workload(out / "workload.csv").jobs
    assert all(job.walltime == readers.derived_walltime(job.duration, 2) for job in jobs)
    summary = simulate(
        capsys,
        str(out / "workload.csv"),
        "--cluster",
        str(out / "cluster.csv"),
        "--pools",
        str(out / "pools.json"),
    )
    assert summary["estimated_start"]["jobs"] > 0, "the waiting work got estimated starts"
    assert summary["estimated_start"]["error_s"]["p50"] is not None


@pytest.mark.parametrize("factor", ["0", "-2", "x", "nan"])
def test_a_walltime_factor_not_above_zero_is_a_usage_error(tmp_path, capsys, factor) -> None:
    workload = tmp_path / "w.csv"
    workload.write_text("job_id,submit_time,duration,gpus\na,0,10,1\n")
    assert main(["sim", str(workload), "--walltime-factor", factor]) == 2
    assert "expected a number > 0" in capsys.readouterr().err


class Captured(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


def test_progress_is_a_line_every_10_s_off_a_terminal_and_a_bar_on_one() -> None:
    from corral.cli.sim import _progress_bar
    from corral.sim.engine import Progress

    now = [0.0]
    stream = Captured(terminal=False)
    show = _progress_bar("corral", stream, clock=lambda: now[0])
    for second in range(25):
        now[0] = float(second)
        show(Progress(now=3600.0 * second, horizon=86400.0, submitted=10 * second, done=second, total=30))
    lines = stream.getvalue().splitlines()
    assert lines == [
        "corral sim: corral: 0/30 jobs done, 0 submitted, simulated 0 s",
        "corral sim: corral: 10/30 jobs done, 100 submitted, simulated 10.0 h",
        "corral sim: corral: 20/30 jobs done, 200 submitted, simulated 20.0 h",
    ]
    show(Progress(now=200_000.0, horizon=86400.0, submitted=300, done=29, total=30, finished=True))
    assert stream.getvalue().splitlines()[-1].startswith("corral sim: corral: 29/30 jobs done"), "the end"
    bar = Captured(terminal=True)
    _progress_bar("fifo", bar, clock=lambda: 0.0)(Progress(60.0, 120.0, 4, 2, 4))
    assert (
        bar.getvalue()
        == "\r  fifo [###############...............] 2/4 jobs done, 4 submitted, simulated 60 s"
    )


def test_the_end_of_a_run_is_shown_once() -> None:
    from corral.cli.sim import _progress_bar
    from corral.sim.engine import Progress

    stream = Captured(terminal=False)
    show = _progress_bar("corral", stream, clock=lambda: 0.0)
    for _ in range(3):
        show(Progress(now=50.0, horizon=10.0, submitted=2, done=2, total=2, finished=True))
    assert stream.getvalue().splitlines() == [
        "corral sim: corral: 2/2 jobs done, 2 submitted, simulated 50 s"
    ]
