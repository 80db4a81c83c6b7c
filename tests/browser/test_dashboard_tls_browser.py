"""The dashboard over HTTPS in a real browser: a server with auth and a certificate, the token
typed into the login page, kept in a ``Secure`` cookie, and a change (a cancel) made with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from corral.client import Client
from tests.e2e.conftest import Certificates

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

TOKEN = "tok-admin-browser"


def test_the_dashboard_over_https_keeps_the_token_in_a_secure_cookie(
    browser, start_server, certificates: Certificates, tmp_path: Path
):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} admin root\n")
    tokens.chmod(0o600)
    server = start_server(
        "--auth-tokens", str(tokens),
        "--tls-cert", str(certificates.certificate), "--tls-key", str(certificates.key),
        ca_file=certificates.ca,
    )  # fmt: skip
    assert server.url.startswith("https://")
    with Client(server.url, token=TOKEN, ca_file=str(certificates.ca)) as admin:
        job = admin.submit_body({"command": "true"})  # no worker: it waits, cancellable

    # Chromium does not know the test CA; what is checked here is the page and its cookie.
    context = browser.new_context(ignore_https_errors=True)
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{server.url}/ui/jobs/{job['id']}")
        page.get_by_label("Token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name=re.compile(f"Job {job['id']}"))).to_be_visible()
        cookie = next(cookie for cookie in context.cookies() if cookie["name"] == "corral_token")
        assert cookie["secure"] is True and cookie["value"] == TOKEN

        page.get_by_role("button", name="Cancel job").click()
        expect(page.locator(".job-head .status")).to_have_text("cancelled", timeout=20_000)
    finally:
        context.close()
