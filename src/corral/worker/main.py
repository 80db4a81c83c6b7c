"""``corral worker``: settings from flags and ``CORRAL_*``, the host's resources, then the agent.

Signals: the first SIGTERM or SIGINT starts a graceful shutdown (stop claiming, let running jobs
finish within ``shutdown_timeout_s``); a second one stops the running jobs at once. Either way the
worker exits 0 once every job has been stopped and reported. A registration the server refuses for
good (a 4xx that asking again would not change, such as resources out of range or a bad token)
stops the worker the same way, and it exits 1 with the server's message.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from types import FrameType
from urllib.parse import urlsplit

from corral.config import WorkerSettings, add_flags, load
from corral.observability.logging import configure_logging
from corral.worker import leftovers, state_lock
from corral.worker.agent import Agent
from corral.worker.resources import resolve_offer

logger = logging.getLogger("corral.worker")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="corral worker", description="Run a corral worker: claim jobs from the server and run them."
    )
    add_flags(parser, WorkerSettings)
    return parser


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_address(server_url: str) -> str:
    """Where gang peers reach this host: loopback when the server is local (a one-host cluster,
    where the host name may not even resolve), else the host name."""
    return "127.0.0.1" if is_loopback_url(server_url) else socket.gethostname()


class ShutdownSignals:
    """Counts SIGTERM/SIGINT: the first asks for a graceful shutdown, the second forces it."""

    def __init__(self, worker_id: str) -> None:
        self.fields = {"worker_id": worker_id}
        self.requested = threading.Event()
        self.forced = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signal_number: int, frame: FrameType | None) -> None:
        name = signal.Signals(signal_number).name
        if self.requested.is_set():
            self.forced.set()
            logger.warning(f"{name} again: stopping running jobs now", extra=self.fields)
        else:
            self.requested.set()
            logger.info(f"{name}: shutting down once running jobs finish", extra=self.fields)


def root_without_auth(settings: WorkerSettings) -> str | None:
    """Why a worker must not start: as root, without auth (no token), for a server not on
    loopback, every job of anyone who can reach the server would run as root on this host. A
    one-machine cluster (``corral up``, the tests) and ``--allow-root-jobs`` are let through."""
    if os.geteuid() != 0 or os.environ.get("CORRAL_TOKEN", "").strip():
        return None
    if is_loopback_url(settings.server) or settings.allow_root_jobs:
        return None
    return (
        "refusing to run jobs as root for a server without auth that is not on loopback: give the worker "
        "a token (CORRAL_TOKEN) so jobs run as their users' accounts, or pass --allow-root-jobs"
    )


def run(arguments: argparse.Namespace) -> int:
    settings: WorkerSettings = load(WorkerSettings, arguments)
    configure_logging(settings.log_level)
    offer = resolve_offer(
        settings.cpus, settings.memory_mb, settings.gpus, settings.vram_mb, settings.gpu_model, settings.label
    )
    worker_id = settings.worker_id or socket.gethostname()
    address = settings.worker_address or default_address(settings.server)
    if refusal := root_without_auth(settings):
        logger.error(refusal, extra={"worker_id": worker_id})
        return 1
    try:
        # Held until the process ends (the kernel drops it then): see corral.worker.state_lock.
        state_lock.hold(leftovers.state_directory(settings.state_dir, worker_id))
    except state_lock.StateDirectoryInUse as error:
        logger.error(str(error), extra={"worker_id": worker_id, "holder_pid": error.pid})
        return 1
    signals = ShutdownSignals(worker_id)
    signals.install()
    agent = Agent(settings, worker_id, address, offer)
    agent.start()
    while not signals.requested.wait(0.5) and not agent.refused.is_set():
        pass
    agent.shutdown(signals.forced)
    if agent.refused.is_set():
        logger.error(
            f"the server refused this worker's registration: {agent.refusal}; exiting",
            extra={"worker_id": worker_id, "server": settings.server},
        )
        print(f"corral worker: the server refused the registration: {agent.refusal}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
