"""Which servers refuse to start in clear (API.md "Transport"): auth on, no TLS, an address other
than loopback, and no ``--insecure-http``."""

from __future__ import annotations

import pytest

from corral.config import ServerSettings
from corral.server.tls import is_loopback, plain_http_refusal


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "10.1.2.3", "example.org", "localhost.example.org"])
def test_hosts_that_others_may_reach(host):
    assert not is_loopback(host)


def test_only_auth_in_clear_off_loopback_is_refused(tmp_path):
    tokens = str(tmp_path / "tokens")
    refused = plain_http_refusal(ServerSettings(host="0.0.0.0", auth_tokens=tokens))
    assert refused is not None and "--insecure-http" in refused and "--tls-cert" in refused
    assert plain_http_refusal(ServerSettings(host="0.0.0.0", auth_tokens=tokens, insecure_http=True)) is None
    assert plain_http_refusal(ServerSettings(host="127.0.0.1", auth_tokens=tokens)) is None
    assert plain_http_refusal(ServerSettings(host="0.0.0.0")) is None, "no auth: no token to leak"
