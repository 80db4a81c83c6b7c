"""Browser fixtures: Playwright for Python driving Debian's Chromium (``/usr/bin/chromium``;
Playwright's own browser download cannot work here), against a real ``corral server`` and real
``corral worker`` processes (the end-to-end fixtures).

The browser tests run once, on SQLite (the store's two backends are the API tests' business), and
are marked ``browser``. Without Chromium they skip, except in CI (``CORRAL_REQUIRE_BROWSER=1``, set
by ``.ci/run``, which installs it), where they fail. A failing test leaves a full-page screenshot
under ``$OUT`` (or ``$CORRAL_SCREENSHOTS``, or a temporary directory), named after the test.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import (  # noqa: F401  (fixtures)
    certificates,
    client,
    reap_groups,
    server,
    start_server,
    start_worker,
)

CHROMIUM = os.environ.get("CORRAL_CHROMIUM", "/usr/bin/chromium")


def _screenshot_dir() -> Path:
    base = os.environ.get("OUT") or os.environ.get("CORRAL_SCREENSHOTS")
    path = Path(base) / "screenshots" if base else Path(tempfile.gettempdir()) / "corral-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium under Playwright's sync API for one module: while it runs, an asyncio loop runs in
    the main thread, which ``asyncio.run`` in later tests could not share."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        message = f"Chromium is not at {CHROMIUM}: apt-get install -y chromium"
        if os.environ.get("CORRAL_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh page (1366x800, a laptop screen) that records console errors and any request to
    another host than the server's (the dashboard must work offline)."""
    context = browser.new_context(viewport={"width": 1366, "height": 800})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    opened.console_errors = []
    opened.foreign_requests = []
    opened.on(
        "console", lambda message: message.type == "error" and opened.console_errors.append(message.text)
    )

    def watch(outgoing: Any) -> None:
        host = urlsplit(outgoing.url).hostname
        if host not in ("127.0.0.1", "localhost", None):
            opened.foreign_requests.append(outgoing.url)

    opened.on("request", watch)
    yield opened
    failed = getattr(request.node, "report_call", None)
    if failed is not None and failed.failed:
        path = _screenshot_dir() / f"{request.node.name}.png"
        try:
            opened.screenshot(path=str(path), full_page=True)
            print(f"screenshot of the failure: {path}")
        except Exception as error:  # the browser may be what broke
            print(f"no screenshot: {error}")
    context.close()
