"""How the server speaks to the network: HTTPS with ``--tls-cert``/``--tls-key``, else plain HTTP,
which a server with auth accepts only where no one else can listen in.

A token is a password: sent in clear across a network, anyone on the path can replay it. So a
server with auth on, listening on an address other than loopback, refuses to start without TLS
unless the operator says ``--insecure-http`` (TLS ended by a proxy in front, a network trusted
for other reasons).
"""

from __future__ import annotations

import ipaddress

from corral.config import ServerSettings

#: TLS 1.2 cipher suites the server offers: forward secret and authenticated only (uvicorn before
#: 0.30 defaulted to "TLSv1", CBC suites of that era). TLS 1.3, preferred by every current
#: client, has its own suites, all of that kind; TLS 1.1 and older are off (Python's default).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as given to ``--host``) only ever reaches this machine: ``localhost`` or
    an address in 127.0.0.0/8 or ``::1``. A host name is not resolved: a name that resolves to
    loopback today may not tomorrow, and "" or ``0.0.0.0`` listen everywhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def uses_tls(settings: ServerSettings) -> bool:
    return settings.tls_cert is not None and settings.tls_key is not None


def plain_http_refusal(settings: ServerSettings) -> str | None:
    """Why the server must not start, or None: auth on, plain HTTP, not on loopback, and no
    ``--insecure-http``."""
    if settings.auth_tokens is None or uses_tls(settings) or settings.insecure_http:
        return None
    if is_loopback(settings.host):
        return None
    return (
        f"refusing to serve tokens over plain HTTP on {settings.host or 'every address'} (not loopback): "
        "give --tls-cert and --tls-key (CORRAL_TLS_CERT, CORRAL_TLS_KEY) to serve HTTPS, or "
        "--insecure-http if TLS is ended in front of the server or the network is trusted"
    )


def scheme(settings: ServerSettings) -> str:
    return "https" if uses_tls(settings) else "http"
