"""Take the README's dashboard screenshots: a real server and two real workers (4 fake GPUs each),
a few jobs, a gang and a failure, then Chromium (through Playwright) on the overview, a job page and
the workers page.

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs/screenshots] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from corral.client import Client

TRAIN = 'for i in $(seq 1 400); do echo "step $i loss $(( 1000 / i ))"; sleep 0.05; done'


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
    server = start(["server", "--db", f"sqlite:///{directory}/c.db", "--port", "0"], directory / "server.log")
    children = [server]
    try:
        assert server.stdout is not None
        url = server.stdout.readline().decode().split("listening on ")[1].split()[0]
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
            client.submit_body({"command": "echo preparing data; exit 0", "name": "prep", "pool": "team-a"})
            client.submit_body({"command": "echo oops >&2; exit 3", "name": "broken", "max_retries": 1})
            train = client.submit_body(
                {
                    "command": TRAIN,
                    "name": "train-llm",
                    "resources": {"gpus": 2, "vram_mb": 40000},
                    "pool": "team-a",
                }
            )
            team_b = {"command": "sleep 600", "pool": "team-b"}
            client.submit_body({**team_b, "name": "ddp", "gang_size": 2, "resources": {"gpus": 2}})
            for index in range(3):
                client.submit_body({**team_b, "name": f"sweep-{index}", "resources": {"gpus": 4}})
            wait(lambda: client.get_job(train["id"])["status"] == "running")
            time.sleep(4)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1366, "height": 860})
                for name, path in (
                    ("overview", "/"),
                    ("job", f"/ui/jobs/{train['id']}"),
                    ("workers", "/ui/workers"),
                ):
                    page.goto(url + path)
                    time.sleep(2.5)  # the live part and the logs have refreshed
                    page.screenshot(path=str(args.out / f"{name}.png"))
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
