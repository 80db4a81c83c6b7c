"""Protocol throughput: no-op jobs through the real HTTP job protocol, no worker processes.

One client process submits ``--jobs`` jobs in batches (``POST /jobs/batch``) while ``--workers``
simulated workers (registered with ``--cpus`` each), as coroutines in the same process, each loop
claim (``GET /jobs/next?worker_id=W``, no wait) then ``POST /jobs/{id}/done?worker_id=W&attempt=N``.
The figure is jobs/s from the first submit sent to the last ``done`` answered. On the same server,
just before, ``noop_http.measure_noop`` measures the no-op ceiling (``GET /healthz``, same client,
same connection count); a job needs ``2 + 1/batch`` requests (with ``--claim-max N``, a claim
answers up to N jobs: ``1 + claims/jobs + 1/batch``), so the protocol ratio is
``jobs/s / (ceiling / requests per job)``: the share of the bare HTTP stack the protocol keeps.

After the run every job must be ``done`` (counted with ``GET /jobs?status=done`` and
``corral_jobs_completed_total``), or the run fails.

    .venv/bin/python bench/protocol.py [--db sqlite,postgres] [--jobs 10000] [--batch 1000] [--workers 8]
        [--claim-max N]   # claims of up to N jobs (GET /jobs/next?max=N)
        [--batched-reports]   # the dones of a claim in one POST /workers/{id}/reports
        [--profile]   # run the server under cProfile and print where its time goes

Targets (2-core machine): >= 1,000 jobs/s on SQLite; ratio >= 40%.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

import harness
import machine
from noop_http import measure_noop_detailed

TARGET_JOBS_S = {"sqlite": 1000.0}
TARGET_RATIO = 40.0


@dataclass
class Run:
    jobs: int
    seconds: float
    submit_seconds: float
    claims: int
    empty_claims: int
    dones: int
    #: requests that carried the dones: one per job, or one per claim with batched reports
    report_requests: int

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds


async def register(conn: harness.HttpConn, worker_id: str, cpus: int) -> None:
    body = orjson.dumps({"id": worker_id, "address": "127.0.0.1", "resources": {"cpus": cpus}})
    await conn.json(b"POST", "/workers/register", body, expect=201)


async def run_protocol(
    host: str,
    port: int,
    jobs: int,
    batch: int,
    workers: int,
    cpus: int,
    timeout_s: float,
    claim_max: int = 0,
    batched_reports: bool = False,
) -> Run:
    """Submit ``jobs`` in batches while ``workers`` coroutines claim and complete them (with
    ``claim_max``, each claim asks for up to that many jobs: ``GET /jobs/next?max=N``; with
    ``batched_reports``, the dones of one claim go in one ``POST /workers/{id}/reports``)."""
    setup = await harness.HttpConn(host, port).connect()
    worker_ids = [f"bench-w{index}" for index in range(workers)]
    for worker_id in worker_ids:
        await register(setup, worker_id, cpus)
    await setup.close()
    bodies = []
    for start in range(0, jobs, batch):
        count = min(batch, jobs - start)
        bodies.append(
            orjson.dumps({"jobs": [{"command": "true", "name": f"noop-{start + i}"} for i in range(count)]})
        )

    submit_conn = await harness.HttpConn(host, port).connect()
    worker_conns = [await harness.HttpConn(host, port).connect() for _ in worker_ids]
    state = {
        "done": 0,
        "claims": 0,
        "claimed_jobs": 0,
        "report_requests": 0,
        "empty": 0,
        "submitted": 0,
        "last_done": 0.0,
        "submit_end": 0.0,
    }
    finished = asyncio.Event()

    async def submitter() -> None:
        for body in bodies:
            answer = await submit_conn.json(b"POST", "/jobs/batch", body, expect=201)
            state["submitted"] += len(answer["items"])
        state["submit_end"] = time.perf_counter()

    async def worker(worker_id: str, conn: harness.HttpConn) -> None:
        request = conn.request
        claim_path = f"/jobs/next?worker_id={worker_id}" + (f"&max={claim_max}" if claim_max else "")
        done_suffix = f"/done?worker_id={worker_id}&attempt="
        reports_path = f"/workers/{worker_id}/reports"
        while not finished.is_set():
            status, content = await request(b"GET", claim_path)
            if status == 204:
                state["empty"] += 1
                # nothing pending yet (the first batch is being inserted) or the tail: back off a little
                await asyncio.sleep(0.002)
                continue
            if status != 200:
                raise harness.HttpError(f"claim by {worker_id}: {status} {content[:300]!r}")
            state["claims"] += 1
            answer = orjson.loads(content)
            if batched_reports:
                started = answer["items"] if claim_max else [answer]
                body = orjson.dumps(
                    {
                        "reports": [
                            {"job_id": job["id"], "attempt": job["attempt"], "outcome": "done"}
                            for job in started
                        ]
                    }
                )
                status, content = await request(b"POST", reports_path, body)
                state["report_requests"] += 1
                if status != 200 or any(item["status"] != 200 for item in orjson.loads(content)["items"]):
                    raise harness.HttpError(f"reports by {worker_id}: {status} {content[:300]!r}")
                state["done"] += len(started)
                state["claimed_jobs"] += len(started)
            for job in [] if batched_reports else answer["items"] if claim_max else [answer]:
                path = f"/jobs/{job['id']}{done_suffix}{job['attempt']}"
                status, content = await request(b"POST", path, b"")
                if status != 200:
                    raise harness.HttpError(f"done of {job['id']} by {worker_id}: {status} {content[:300]!r}")
                state["done"] += 1
                state["claimed_jobs"] += 1
                state["report_requests"] += 1
            if state["done"] >= jobs:
                state["last_done"] = time.perf_counter()
                finished.set()

    started = time.perf_counter()
    tasks = [asyncio.create_task(submitter())]
    tasks += [asyncio.create_task(worker(w, c)) for w, c in zip(worker_ids, worker_conns, strict=True)]
    gathered = asyncio.gather(*tasks)
    try:
        await asyncio.wait_for(gathered, timeout_s)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await gathered  # retrieved, so asyncio does not warn about it at exit
        for conn in [submit_conn, *worker_conns]:
            await conn.close()
    return Run(
        jobs=jobs,
        seconds=state["last_done"] - started,
        submit_seconds=state["submit_end"] - started,
        claims=int(state["claims"]),
        empty_claims=int(state["empty"]),
        dones=int(state["done"]),
        report_requests=int(state["report_requests"]),
    )


async def verify(host: str, port: int, jobs: int) -> tuple[int, float]:
    """Every job is done: the list count and the completion counter."""
    conn = await harness.HttpConn(host, port).connect()
    try:
        done = await harness.count_jobs(conn, "done")
        _, text = await conn.request(b"GET", "/metrics")
        completed = harness.metric(text.decode(), "corral_jobs_completed_total")
        others = await harness.count_jobs(conn, "pending,running,failed")
    finally:
        await conn.close()
    if done != jobs or completed != jobs or others:
        raise AssertionError(
            f"after the run: {done} jobs done (list), {completed:.0f} completed (metric), {others} not done;"
            f" expected {jobs}"
        )
    return done, completed


async def bench_backend(
    args: argparse.Namespace, server: harness.Server, processes: harness.Processes, directory: Path
) -> dict[str, float]:
    setup = await harness.HttpConn(server.host, server.port).connect()
    await harness.wait_ready(setup)
    await setup.close()
    noop = await measure_noop_detailed(
        server.host, server.port, args.workers, args.noop_seconds, server_pid=server.child.process.pid
    )
    ceiling = noop.requests_per_s
    spy = None
    if args.profile == "py-spy":
        spy = harness.start_pyspy(processes, server.child.process.pid, directory / f"pyspy-{server.port}.txt")
    server_cpu, client_cpu = (
        harness.cpu_seconds(server.child.process.pid, children=True),
        harness.self_cpu_seconds(),
    )
    postgres_before = harness.postgres_cpu_seconds() if args.backend == "postgres" else {}
    try:
        run = await run_protocol(
            server.host,
            server.port,
            args.jobs,
            args.batch,
            args.workers,
            args.cpus,
            args.timeout,
            args.claim_max,
            args.batched_reports,
        )
    finally:
        server_cpu = harness.cpu_seconds(server.child.process.pid, children=True) - server_cpu
        client_cpu = harness.self_cpu_seconds() - client_cpu
        postgres_cpu = harness.postgres_cpu_delta(postgres_before) if postgres_before else float("nan")
        if spy is not None:
            harness.stop_pyspy(processes, spy)
    done, completed = await verify(server.host, server.port, args.jobs)
    # a claim answered 200 per job, or with --claim-max the claims actually answered 200 (each
    # starting up to that many jobs)
    per_job = run.report_requests / args.jobs + run.claims / args.jobs + 1 / args.batch
    return {
        "ceiling": ceiling,
        "jobs_s": run.jobs_per_s,
        "seconds": run.seconds,
        "submit_seconds": run.submit_seconds,
        "empty": run.empty_claims,
        "claims": run.claims,
        "done": done,
        "completed": completed,
        "per_job": per_job,
        "ratio": 100 * run.jobs_per_s / (ceiling / per_job),
        "server_cpu": server_cpu,
        "noop_cpu_ms": noop.server_cpu_per_request_ms,
        "postgres_cpu": postgres_cpu,
        "client_cpu": client_cpu,
    }


def report(backend: str, args: argparse.Namespace, result: dict[str, float]) -> None:
    harness.banner(
        f"protocol on {backend}: {args.jobs} no-op jobs, batches of {args.batch},"
        f" {args.workers} simulated workers"
        + (f", claims with max={args.claim_max}" if args.claim_max else "")
        + (", a claim's dones in one POST /workers/{id}/reports" if args.batched_reports else "")
    )
    print(
        harness.figure(
            "jobs/s (first submit -> last done)", result["jobs_s"], "jobs/s", TARGET_JOBS_S.get(backend)
        )
    )
    print(harness.figure("wall time", result["seconds"], "s"))
    print(harness.figure("  of which submitting (all batches answered)", result["submit_seconds"], "s"))
    print(harness.figure("no-op ceiling, same server (GET /healthz)", result["ceiling"], "req/s"))
    claims = "claim" if not args.claim_max else f"claims with max={args.claim_max} per job"
    print(
        f"  {'requests per job':<48} {result['per_job']:>10.3f}          ({claims} + "
        + ("reports per job" if args.batched_reports else "done")
        + " + 1/batch submit)"
    )
    print(harness.figure("ceiling / requests per job", result["ceiling"] / result["per_job"], "jobs/s"))
    print(harness.figure("ratio jobs/s / (ceiling / requests per job)", result["ratio"], "%", TARGET_RATIO))
    print(
        f"  CPU during the run: server {result['server_cpu']:.1f}s"
        f" ({100 * result['server_cpu'] / result['seconds']:.0f}% of one core),"
        f" client {result['client_cpu']:.1f}s ({100 * result['client_cpu'] / result['seconds']:.0f}%)"
        + (
            f", PostgreSQL processes {result['postgres_cpu']:.1f}s"
            f" ({100 * result['postgres_cpu'] / result['seconds']:.0f}%)"
            if result["postgres_cpu"] == result["postgres_cpu"]
            else ""
        )
    )
    per_job_ms = 1e3 * result["server_cpu"] / args.jobs
    print(
        f"  server CPU per job {1e3 * per_job_ms:.0f} us vs per no-op request"
        f" {1e3 * result['noop_cpu_ms']:.0f} us:"
        f" a job costs the server {per_job_ms / result['noop_cpu_ms']:.1f} no-op requests"
        f" (it sends {result['per_job']:.3f})"
    )
    print(
        f"  extra: {result['claims']:.0f} claims answered 200, {result['empty']:.0f} answered 204"
        " (empty queue, not counted in requests per job)"
    )
    print(
        f"  verified: {result['done']:.0f} jobs done (GET /jobs?status=done), "
        f"corral_jobs_completed_total {result['completed']:.0f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="sqlite,postgres", help="comma list of sqlite, postgres")
    parser.add_argument("--pg-url", default=harness.DEFAULT_PG_URL, help="database a fresh schema is made in")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1000, help="jobs per POST /jobs/batch")
    parser.add_argument("--workers", type=int, default=8, help="simulated workers (one connection each)")
    parser.add_argument("--cpus", type=int, default=64, help="cpus each simulated worker registers")
    parser.add_argument(
        "--claim-max",
        type=int,
        default=0,
        help="claim up to this many jobs per claim (GET /jobs/next?max=N, 1..64); 0: single claims",
    )
    parser.add_argument(
        "--batched-reports",
        action="store_true",
        help="the dones of each claim in one POST /workers/{id}/reports (best with --claim-max)",
    )
    parser.add_argument("--noop-seconds", type=float, default=3.0, help="window of the no-op ceiling")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="bound on one backend's protocol run (s)"
    )
    parser.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="PostgreSQL session setting for the server's connection (e.g. synchronous_commit=off)",
    )
    parser.add_argument("--server-arg", action="append", default=[], help="extra flag for corral server")
    parser.add_argument(
        "--profile",
        choices=["none", "py-spy", "cprofile"],
        default="none",
        help="py-spy: sample the server during the protocol run (pip install py-spy);"
        " cprofile: run the whole server under cProfile. Prints where the server's time goes.",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (server logs, profiles)")
    args = parser.parse_args(argv)
    backends = [name.strip() for name in args.db.split(",") if name.strip()]
    for name in backends:
        if name not in ("sqlite", "postgres"):
            parser.error(f"unknown backend {name!r}")

    machine.print_machine()
    if "postgres" in backends:
        print(f"  postgres {harness.postgres_version(args.pg_url)} at {args.pg_url}")
    harness.new_event_loop_policy()
    processes = harness.Processes()
    results: dict[str, dict[str, float]] = {}
    failed = False
    try:
        bound = len(backends) * (args.timeout + args.noop_seconds + 60)
        with harness.bounded(bound), harness.workdir(args.keep) as directory:
            for backend in backends:
                with harness.store_url(backend, directory, args.pg_url, args.pg_setting) as db_url:
                    profile = directory / f"server-{backend}.prof" if args.profile == "cprofile" else None
                    server = harness.start_server(processes, db_url, directory, args.server_arg, profile)
                    try:
                        args.backend = backend
                        results[backend] = asyncio.run(bench_backend(args, server, processes, directory))
                    except (AssertionError, harness.HttpError, TimeoutError) as error:
                        print(f"\nprotocol on {backend} FAILED: {error!r}", flush=True)
                        print(f"  server log tail:\n{server.child.log.read_text(errors='replace')[-2000:]}")
                        failed = True
                    finally:
                        processes.stop(server.child)
                    if backend in results:
                        report(backend, args, results[backend])
                    if profile is not None:
                        harness.print_profile(profile)
                    if args.profile == "py-spy":
                        harness.print_collapsed(directory / f"pyspy-{server.port}.txt")
    except KeyboardInterrupt:
        print("interrupted; processes stopped", file=sys.stderr)
        return 130
    finally:
        processes.stop_all()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
