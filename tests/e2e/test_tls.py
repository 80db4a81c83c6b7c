"""TLS end to end (API.md "Transport"): a real ``corral server --tls-cert --tls-key``, the CLI and a
real worker reaching it over ``https://`` with ``CORRAL_CA_FILE``; a wrong CA and a plain-HTTP
client refused with a message, never a stack trace; a server with auth refusing plain HTTP on an
address other than loopback unless ``--insecure-http``.

The certificates come from the ``certificates`` fixture (``tests/e2e/conftest.py``): a test CA, a
server certificate it signs for 127.0.0.1 and localhost, and a second CA that signed nothing of the
server's.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from corral.client import Client, ServerUnreachable
from corral.transport import TlsError
from tests.e2e.conftest import Certificates, clean_environment, make_ca, wait_for

pytestmark = pytest.mark.e2e

TOKENS = "tok-admin-tls admin root\n"


def _tls_flags(certificates: Certificates) -> tuple[str, ...]:
    return ("--tls-cert", str(certificates.certificate), "--tls-key", str(certificates.key))


def _cli(url: str, ca_file: Path | None, *arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**clean_environment(), "CORRAL_SERVER": url}
    if ca_file is not None:
        env["CORRAL_CA_FILE"] = str(ca_file)
    return subprocess.run(
        [sys.executable, "-m", "corral", *arguments],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_and_a_worker_run_a_job_over_https(
    tmp_path: Path, certificates: Certificates, start_server, start_worker
):
    server = start_server(*_tls_flags(certificates), ca_file=certificates.ca)
    assert server.url.startswith("https://127.0.0.1:")
    worker = start_worker(server.url, "w1", env={"CORRAL_CA_FILE": str(certificates.ca)})

    submitted = _cli(server.url, certificates.ca, "submit", "--wait", "--", "echo", "over-tls", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stderr.strip()
    assert submitted.stdout.strip() == f"{job_id}: done"

    with Client(server.url, ca_file=str(certificates.ca)) as client:
        job = client.get_job(job_id)
        assert job.status == "done" and job.worker_id == "w1"
    logs = _cli(server.url, certificates.ca, "logs", job_id, cwd=tmp_path)
    assert logs.returncode == 0 and "over-tls" in logs.stdout, logs.stderr
    assert "Traceback" not in worker.log()


def test_a_client_with_the_wrong_ca_is_refused_with_a_message(
    tmp_path: Path, certificates: Certificates, start_server, start_worker
):
    server = start_server(*_tls_flags(certificates), ca_file=certificates.ca)

    refused = _cli(server.url, certificates.other_ca, "jobs", cwd=tmp_path)
    assert refused.returncode == 3
    assert "certificate is not trusted" in refused.stderr and "CORRAL_CA_FILE" in refused.stderr
    assert "Traceback" not in refused.stderr
    # No CORRAL_CA_FILE: the system's trust store, which does not know the test CA either.
    assert "certificate is not trusted" in _cli(server.url, None, "jobs", cwd=tmp_path).stderr

    with Client(server.url, ca_file=str(certificates.other_ca)) as sdk:
        with pytest.raises(ServerUnreachable) as raised:
            sdk.health()
        assert isinstance(raised.value.__cause__, TlsError)

    worker = start_worker(server.url, "w-wrong-ca", env={"CORRAL_CA_FILE": str(certificates.other_ca)})
    wait_for(lambda: "certificate is not trusted" in worker.log(), 15.0, "the worker to say why")
    assert "Traceback" not in worker.log()
    with Client(server.url, ca_file=str(certificates.ca)) as client:
        assert client.workers() == [], "the worker never reached the server"


def test_a_plain_http_client_to_the_tls_port_fails_cleanly(
    tmp_path: Path, certificates: Certificates, start_server
):
    server = start_server(*_tls_flags(certificates), ca_file=certificates.ca)
    plain_url = server.url.replace("https://", "http://")

    refused = _cli(plain_url, certificates.ca, "jobs", cwd=tmp_path)
    assert refused.returncode == 3
    assert "use an https:// URL" in refused.stderr
    assert "Traceback" not in refused.stderr
    with Client(plain_url) as sdk, pytest.raises(ServerUnreachable):
        sdk.health()

    # The server shrugs it off and goes on serving HTTPS.
    assert _cli(server.url, certificates.ca, "jobs", cwd=tmp_path).returncode == 0
    assert "Traceback" not in server.log_path.read_text()


def test_an_https_client_to_a_plain_server_is_told_to_use_http(tmp_path: Path, certificates, server):
    refused = _cli(server.url.replace("http://", "https://"), certificates.ca, "jobs", cwd=tmp_path)
    assert refused.returncode == 3
    assert "does not speak TLS" in refused.stderr and "http:// URL" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_server_with_auth_refuses_plain_http_off_loopback_unless_told(
    tmp_path: Path, certificates: Certificates, start_server
):
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    database = tmp_path / "refused.db"
    refused = subprocess.run(
        [sys.executable, "-m", "corral", "server", "--db", f"sqlite:///{database}", "--port", "0"],
        env={**clean_environment(), "CORRAL_HOST": "0.0.0.0", "CORRAL_AUTH_TOKENS": str(tokens)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0
    assert "refusing to serve tokens over plain HTTP on 0.0.0.0" in refused.stderr
    assert "--tls-cert" in refused.stderr and "--insecure-http" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stdout == ""
    assert not database.exists(), "refused before the store was opened"

    insecure = start_server("--host", "0.0.0.0", "--auth-tokens", str(tokens), "--insecure-http")
    assert insecure.url.startswith("http://")
    page = httpx.get(f"{insecure.url}/ui/jobs", headers={"Accept": "text/html"})
    assert page.status_code == 401 and "token-form" in page.text

    secure = start_server(
        "--host", "0.0.0.0", "--auth-tokens", str(tokens), *_tls_flags(certificates), ca_file=certificates.ca
    )
    context = ssl.create_default_context(cafile=str(certificates.ca))
    page = httpx.get(f"{secure.url}/ui/jobs", headers={"Accept": "text/html"}, verify=context)
    assert page.status_code == 401 and "token-form" in page.text
    # the form's script makes the cookie Secure over HTTPS (a real browser checks it:
    # tests/browser/test_dashboard_tls_browser.py)
    script = httpx.get(f"{secure.url}/ui/static/login.js", verify=context)
    assert 'location.protocol === "https:" ? "; Secure"' in script.text
    with Client(secure.url, token="tok-admin-tls", ca_file=str(certificates.ca)) as admin:
        assert admin.workers() == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--tls-cert", "CERT"), "--tls-cert and --tls-key go together"),
        (("--tls-cert", "CERT", "--tls-key", "OTHER_KEY"), "KEY_VALUES_MISMATCH"),
        (("--tls-cert", "MISSING", "--tls-key", "KEY"), "No such file or directory"),
    ],
)
def test_a_certificate_that_cannot_serve_stops_the_server_at_start(
    tmp_path: Path, certificates: Certificates, flags: tuple[str, ...], message: str
):
    make_ca(tmp_path, "stray")
    paths = {
        "CERT": certificates.certificate,
        "KEY": certificates.key,
        "OTHER_KEY": tmp_path / "stray.key",
        "MISSING": tmp_path / "missing.pem",
    }
    arguments = [str(paths.get(flag, flag)) for flag in flags]
    stopped = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "server",
            "--db",
            f"sqlite:///{tmp_path}/c.db",
            "--port",
            "0",
            *arguments,
        ],
        env=clean_environment(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert stopped.returncode != 0 and stopped.stdout == ""
    assert message in stopped.stderr and "Traceback" not in stopped.stderr
