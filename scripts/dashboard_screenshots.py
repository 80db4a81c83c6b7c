"""Take the README's dashboard screenshots: a real server and two real workers (4 fake GPUs each),
a pools tree, a few jobs, a gang, an array, dependencies, a job no worker can hold and a failure,
then Chromium (through Playwright) on the overview, the jobs, a job page, the workers, the pools
and (a second server, with auth on) the sign-in page.

The overview's last 24 hours are drawn from the store's samples, which the server takes once a
minute: a fresh server has none, so the script writes a day of made-up samples (a queue that builds
up in the morning and drains, the GPUs allocated following it) before it starts the server.

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs/screenshots] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from corral.client import Client
from corral.domain.history import ClusterSample, sample_slot
from corral.store import open_store

TRAIN = 'for i in $(seq 1 3000); do echo "step $i loss $(( 1000 / i ))"; sleep 0.05; done'


def start(arguments: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "corral", *arguments], stdout=subprocess.PIPE, stderr=log.open("wb")
    )


def wait(check, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError("timed out")


def seed_history(url: str, now: float) -> None:
    """A made-up day of samples (see the module docstring): 8 GPUs, a queue peaking mid-day."""
    store = open_store(url)
    try:
        minute = sample_slot(now)
        for ago in range(24 * 60, 0, -1):
            hour = (24 * 60 - ago) / 60
            wave = max(0.0, math.sin(math.pi * (hour - 6) / 14)) if 6 <= hour <= 20 else 0.0
            queued = round(14 * wave + 2 * math.sin(ago / 17) ** 2)
            allocated = min(8, round(2 + 6 * min(1.0, wave * 1.6)))
            store.history.record_sample(
                ClusterSample(minute - 60 * ago, queued, allocated // 2, 8, allocated)
            )
    finally:
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="corral-shots-"))
    gpu_file = directory / "gpu.json"
    gpu_file.write_text(json.dumps({"util_pct": 87, "mem_used_mb": 30000}))
    database = f"sqlite:///{directory}/c.db"
    seed_history(database, time.time())
    server = start(["server", "--db", database, "--port", "0"], directory / "server.log")
    tokens = directory / "tokens"
    tokens.write_text("screenshot-token admin root\n")
    tokens.chmod(0o600)
    secured = start(
        ["server", "--db", f"sqlite:///{directory}/auth.db", "--port", "0", "--auth-tokens", str(tokens)],
        directory / "secured.log",
    )
    children = [server, secured]
    try:
        assert server.stdout is not None
        url = server.stdout.readline().decode().split("listening on ")[1].split()[0]
        assert secured.stdout is not None
        secured_url = secured.stdout.readline().decode().split("listening on ")[1].split()[0]
        for name in ("node-a", "node-b"):
            children.append(  # noqa: PERF401
                start(
                    [
                        "worker", "--server", url, "--worker-id", name, "--gpus", "4", "--vram-mb", "81920",
                        "--gpu-model", "H100", "--gpu-sampler", f"fake:{gpu_file}", "--heartbeat-s", "0.5",
                        "--worker-heartbeat-s", "1", "--cpus", "32", "--memory-mb", "256000",
                    ],
                    directory / f"{name}.log",
                )
            )  # fmt: skip
        with Client(url) as client:
            wait(lambda: len(client.workers()) == 2)
            for path, settings in (
                ("team-a", {"weight": 2}),
                ("team-b", {}),
                ("team-b/vision", {"weight": 2}),
            ):
                client.put_pool(path, settings)
            prep = client.submit_body(
                {"command": "echo preparing data; sleep 3", "name": "prep", "pool": "team-a"}
            )
            client.submit_body({"command": "echo oops >&2; exit 3", "name": "broken", "max_retries": 1})
            train = client.submit_body(
                {
                    "command": TRAIN,
                    "name": "train-llm",
                    "resources": {"gpus": 2, "vram_mb": 40000},
                    "pool": "team-a",
                    "after": [{"id": prep["id"], "when": "ok"}],  # its timeline: waiting, then running
                }
            )
            # the rest once it runs: team-b's work would otherwise take its GPUs while it waits
            wait(lambda: client.get_job(train["id"])["status"] == "running")
            team_b = {"command": "sleep 600", "pool": "team-b"}
            client.submit_body({**team_b, "name": "ddp", "gang_size": 2, "resources": {"gpus": 2}})
            client.submit_body({"command": "sleep 600", "pool": "team-b/vision", "resources": {"gpus": 1}})
            sweep = client.submit_body({**team_b, "name": "sweep", "array": "0-2", "resources": {"gpus": 4}})
            client.submit_body(
                {
                    "command": "echo best",
                    "name": "pick-best",
                    "after": [{"id": sweep["array_id"], "when": "ok"}],
                }
            )
            client.submit_body({"command": "true", "name": "huge", "resources": {"gpus": 16}})
            # the made-up day ends with 2 GPUs held, and the server's first sample may be of the
            # cluster before these jobs: wait for a minute's sample of them (they hold 7 of the 8
            # GPUs), so that the charts end where the rest of the page is
            wait(lambda: re.search(r"now [3-8] GPUs held", httpx.get(url + "/").text), 150.0)
            time.sleep(4)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1366, "height": 860})
                for name, address in (
                    ("overview", url + "/"),
                    ("jobs", url + "/ui/jobs"),
                    ("job", f"{url}/ui/jobs/{train['id']}"),
                    ("workers", url + "/ui/workers"),
                    ("pools", url + "/ui/pools"),
                    ("sign-in", secured_url + "/"),
                ):
                    page.goto(address)
                    time.sleep(2.5)  # the live part and the logs have refreshed
                    # the job page whole: its field groups are below the logs
                    page.screenshot(path=str(args.out / f"{name}.png"), full_page=name == "job")
                    print(f"wrote {args.out / f'{name}.png'}")
                browser.close()
    finally:
        for child in reversed(children):
            child.terminate()
        for child in reversed(children):
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                child.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
