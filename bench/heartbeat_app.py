"""CPU per batched worker heartbeat inside the application: no uvicorn, no socket (issue 26).

One worker with ``--gpus`` GPUs runs ``--gpus`` one-GPU jobs; its heartbeat (every GPU's reading,
its ``running`` list and every job's lease with progress, as ``bench/fleet.py --batched`` sends it)
is called ``--beats`` times straight through the server's ASGI application (middleware, route,
validation, store, answer) on a fresh store. Printed per round: this process's CPU per heartbeat
(on PostgreSQL the store thread's share included, the database's not) and the wall time. What
``fleet.py`` measures adds the HTTP server and the kernel to this; this part is what the server's
own code costs, steady enough on a shared machine to compare two checkouts round by round.

    .venv/bin/python bench/heartbeat_app.py [--db sqlite|postgres] [--beats 2000] [--rounds 3]
        [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson

import harness
from corral.config import ServerSettings
from corral.server.app import create_app
from corral.store import open_store


async def call(app: Any, method: str, path: str, body: bytes = b"", query: bytes = b"") -> tuple[int, bytes]:
    """One request through the ASGI application: its status and body. Written out rather than
    httpx's ``ASGITransport`` (the tests' in-process client): its own per-request work would be
    counted in this process's CPU, the figure this bench reports."""
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:  # the answer is sent before anyone listens for a disconnect
            await asyncio.Event().wait()
        received = True
        return {"type": "http.request", "body": body, "more_body": False}

    status = 0
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"bench")],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    await app(scope, receive, send)
    return status, b"".join(chunks)


async def bench(url: str, gpus: int, beats: int, rounds: int, db: str) -> None:
    store = open_store(url)
    app = create_app(store, ServerSettings(), run_loops=False)
    try:
        async with app.router.lifespan_context(app):
            resources = {"gpus": gpus, "cpus": 64, "memory_mb": 100_000}
            registration = {"id": "w1", "address": "127.0.0.1", "resources": resources}
            status, answer = await call(app, "POST", "/workers/register", orjson.dumps(registration))
            assert status == 201, answer
            for _ in range(gpus):
                job = {"command": "true", "resources": {"gpus": 1}}
                status, answer = await call(app, "POST", "/jobs", orjson.dumps(job))
                assert status == 201, answer
            leases = []
            for _ in range(gpus):
                status, answer = await call(app, "GET", "/jobs/next", query=b"worker_id=w1")
                assert status == 200, answer
                claimed = orjson.loads(answer)
                leases.append((claimed["id"], claimed["attempt"]))
            readings = [{"index": index, "util_pct": 95.0, "mem_used_mb": 60000} for index in range(gpus)]
            running = [job_id for job_id, _ in leases]
            bodies = [
                orjson.dumps(
                    {
                        "gpus": readings,
                        "running": running,
                        "jobs": [
                            {"id": job_id, "attempt": attempt, "progress": {"step": step}}
                            for job_id, attempt in leases
                        ],
                    }
                )
                for step in range(beats)
            ]
            status, answer = await call(app, "POST", "/workers/w1/heartbeat", bodies[0])
            assert status == 200 and all(item == {} for item in orjson.loads(answer)["jobs"].values()), answer
            for round_number in range(1, rounds + 1):
                cpu, wall = time.process_time(), time.perf_counter()
                for body in bodies:
                    await call(app, "POST", "/workers/w1/heartbeat", body)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                print(
                    f"  {db} round {round_number}: {1e6 * cpu / beats:.0f} us CPU per heartbeat,"
                    f" {1e6 * wall / beats:.0f} us wall",
                    flush=True,
                )
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg-url", default=harness.DEFAULT_PG_URL)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of the worker, one job on each")
    parser.add_argument("--beats", type=int, default=2000, help="heartbeats per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="the event loop: uvloop, as `corral server` runs (default), or asyncio's own",
    )
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    with harness.workdir(False) as directory, harness.store_url(args.db, directory, args.pg_url) as url:
        asyncio.run(bench(url, args.gpus, args.beats, args.rounds, args.db))


if __name__ == "__main__":
    main()
