"""``corral server``: settings from flags and ``CORRAL_*``, the store, then uvicorn (over TLS when
``--tls-cert``/``--tls-key`` are given: ``corral.server.tls``)."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette

from corral.config import ServerSettings, add_flags, load
from corral.domain import errors
from corral.observability.logging import configure_logging
from corral.server import collector, connections, sqlite_lock, tls
from corral.server.state import state_of_app

logger = logging.getLogger("corral.server")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="corral server", description="Run the corral server.")
    add_flags(parser, ServerSettings)
    return parser


def run(arguments: argparse.Namespace) -> int:
    from corral.server.app import create_app
    from corral.store import open_store

    settings: ServerSettings = load(ServerSettings, arguments)
    configure_logging(settings.log_level)
    collector.set_first_threshold(settings.gc_threshold)
    if refusal := tls.plain_http_refusal(settings):
        print(f"corral server: {refusal}", file=sys.stderr)
        return 2
    try:
        lock = sqlite_lock.acquire(settings.db)
    except sqlite_lock.HeldByAnother as error:
        print(f"corral server: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"corral server: cannot create the SQLite lock file: {error}", file=sys.stderr)
        return 2
    try:
        store = open_store(settings.db, busy_timeout_s=settings.store_busy_timeout_s)
    except errors.CorralError as error:
        print(f"corral server: {error.message}", file=sys.stderr)
        return 2
    try:
        app = create_app(store, settings, store_url=settings.db)
    except OSError as error:
        print(f"corral server: cannot read the token file (--auth-tokens): {error.strerror}", file=sys.stderr)
        store.close()
        return 2
    config = uvicorn_config(
        app,
        settings,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=settings.access_log,
        timeout_graceful_shutdown=5,
        # Every connection this process accepts (it is the only one that listens: the offload
        # processes speak over pipes) goes through TLS when the settings give a certificate.
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
        ssl_ciphers=tls.TLS12_CIPHERS,
    )
    server = uvicorn.Server(config)
    try:
        listener = _listen(settings.host, settings.port)
    except OSError as error:
        print(f"corral server: cannot listen on {settings.host}:{settings.port}: {error}", file=sys.stderr)
        return 2
    _fit_connections(state_of_app(app).connections, settings)
    host, port = listener.getsockname()[:2]
    url = f"{tls.scheme(settings)}://{_url_host(host)}:{port}"
    print(f"corral server listening on {url} (store: {store.dialect})", flush=True)
    server.run(sockets=[listener])
    store.close()
    if lock is not None:
        lock.close()
    return 0


def uvicorn_config(app: Starlette, settings: ServerSettings, **options: Any) -> uvicorn.Config:
    """uvicorn serving ``app`` with corral's protocol (``server.connections``: the header timeout,
    the connection limits) and idle timeout; ``options`` are uvicorn's own."""
    protocol = connections.guarded_protocol(state_of_app(app).connections, settings.header_timeout_s)
    return uvicorn.Config(
        app,
        http=protocol,
        loop="uvloop",
        lifespan="on",
        # typed int by uvicorn, used as a float (``loop.call_later``)
        timeout_keep_alive=settings.idle_timeout_s,  # type: ignore[arg-type]
        **options,
    )


def _fit_connections(book: connections.ConnectionBook, settings: ServerSettings) -> None:
    """Raise the open-file limit, and keep the connections under it with a reserve to spare:
    running out of descriptors is then a 503 for one more client, not a failure of the store,
    a child process or the listener."""
    limit = connections.raise_descriptor_limit()
    allowed = book.fit_descriptors(limit, connections.descriptors_in_use())
    if allowed < settings.max_connections:
        logger.warning(
            "connections limited by the open-file limit",
            extra={"max_connections": allowed, "open_file_limit": limit},
        )


def _listen(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts so the URL printed is the real one, even with ``--port 0``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    # Listen now, not when uvicorn starts: the line printed next promises the URL accepts
    # connections (the kernel queues them until uvicorn serves).
    listener.listen(2048)
    listener.set_inheritable(True)
    return listener


def _url_host(host: str) -> str:
    """An IPv6 address in brackets, as a URL needs it."""
    return f"[{host}]" if ":" in host else host


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
