"""What every benchmark shares: child processes that are always cleaned up, a temporary store
(SQLite file or a fresh PostgreSQL schema), the real server as a subprocess, a cheap HTTP/1.1
client, and the figure/target lines.

The client is raw keep-alive HTTP/1.1 over asyncio streams (uvloop when installed): on a 2-core
machine the load generator shares the CPUs with the server, so the cheapest correct client leaves
the most for the thing measured. It speaks just what corral's server answers: ``content-length``
bodies (chunked too, for safety), 204 without a body, keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
LISTEN_LINE = re.compile(r"corral server listening on (http://([0-9.]+):(\d+))")


class BenchTimeout(Exception):
    """The benchmark ran past its time bound."""


# --- processes -------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the benchmark process dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class Processes:
    """Every process a benchmark starts, each in its own process group, stopped on exit."""

    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Child:
        with open(log, "wb") as out:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def stop(self, child: Child, grace_s: float = 10.0) -> None:
        """SIGTERM the child's process group, wait ``grace_s``, then SIGKILL it."""
        process = child.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace_s)
        # whatever the child left in its group (job processes of a worker) goes too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
        if child in self.children:
            self.children.remove(child)

    def stop_all(self) -> None:
        for child in reversed(list(self.children)):
            self.stop(child)


@contextlib.contextmanager
def bounded(timeout_s: float) -> Iterator[None]:
    """A hard bound on the whole benchmark: SIGALRM raises ``BenchTimeout``; SIGTERM is a Ctrl-C.

    Each benchmark also bounds its own async phases; this is the backstop that still fires when a
    phase hangs somewhere else (a child that never prints its address, a blocking read).
    """

    def on_alarm(signum: int, frame: Any) -> None:
        raise BenchTimeout(f"benchmark ran past its bound of {timeout_s:.0f}s")

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous_alarm = signal.signal(signal.SIGALRM, on_alarm)
    previous_term = signal.signal(signal.SIGTERM, on_term)
    signal.alarm(max(1, int(timeout_s)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous_alarm)
        signal.signal(signal.SIGTERM, previous_term)


@contextlib.contextmanager
def workdir(keep: bool = False) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    try:
        yield path
    finally:
        if keep:
            print(f"(kept work directory {path})")
        else:
            shutil.rmtree(path, ignore_errors=True)


# --- stores ----------------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_store(backend: str) -> Iterator[Any]:
    """A fresh store opened on ``backend`` (``store_url`` in a temporary directory), closed after:
    for the benchmarks that drive the store API without a server."""
    from corral.store import open_store

    with tempfile.TemporaryDirectory() as directory, store_url(backend, Path(directory)) as url:
        store = open_store(url)
        try:
            yield store
        finally:
            store.close()


@contextlib.contextmanager
def store_url(
    backend: str, directory: Path, pg_url: str = DEFAULT_PG_URL, pg_settings: Sequence[str] = ()
) -> Iterator[str]:
    """A fresh, empty store: a SQLite file in ``directory``, or a new PostgreSQL schema dropped after.

    ``pg_settings`` (``name=value``) become ``-c`` options of the server's PostgreSQL session, for
    experiments such as ``synchronous_commit=off``.
    """
    if backend == "sqlite":
        yield f"sqlite:///{directory / 'bench.db'}"
        return
    if backend != "postgres":
        raise ValueError(f"unknown backend {backend!r}")
    import psycopg

    schema = f"corral_bench_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in pg_url else "?"
    settings = [f"search_path={schema}", *pg_settings]
    options = "%20".join("-c" + setting.replace("=", "%3D", 1) for setting in settings)
    try:
        yield f"{pg_url}{separator}options={options}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def postgres_version(pg_url: str = DEFAULT_PG_URL) -> str:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as connection:
        row = connection.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


# --- the server ------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    host: str
    port: int
    child: Child
    profile: Path | None


def start_server(
    processes: Processes,
    db_url: str,
    directory: Path,
    extra_args: Sequence[str] = (),
    profile: Path | None = None,
    timeout_s: float = 30.0,
) -> Server:
    """``python -m corral server --db URL --port 0``; waits for its ``listening on`` line.

    With ``profile``, the server runs under cProfile and writes its stats there when it stops.
    """
    argv = [PYTHON]
    if profile is not None:
        argv += ["-m", "cProfile", "-o", str(profile)]
    argv += ["-m", "corral", "server", "--db", db_url, "--host", "127.0.0.1", "--port", "0", *extra_args]
    log = directory / f"server-{len(processes.children)}.log"
    child = processes.start("server", argv, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        match = LISTEN_LINE.search(text)
        if match:
            server = Server(match.group(1), match.group(2), int(match.group(3)), child, profile)
            _wait_accepting(server, deadline)
            return server
        if child.process.poll() is not None:
            raise RuntimeError(f"server exited with {child.process.returncode}:\n{text[-3000:]}")
        time.sleep(0.02)
    raise RuntimeError(
        f"server did not print its address within {timeout_s:.0f}s:\n{log.read_text()[-3000:]}"
    )


def start_worker(
    processes: Processes,
    server_url: str,
    worker_id: str,
    directory: Path,
    cpus: int = 64,
    heartbeat_s: float = 1.0,
    extra_args: Sequence[str] = (),
) -> Child:
    """A real ``python -m corral worker`` on this machine (no GPUs offered, so no NVML probing)."""
    argv = [
        PYTHON,
        "-m",
        "corral",
        "worker",
        "--server",
        server_url,
        "--worker-id",
        worker_id,
        "--worker-address",
        "127.0.0.1",
        "--cpus",
        str(cpus),
        "--gpus",
        "0",
        "--heartbeat-s",
        str(heartbeat_s),
        "--worker-heartbeat-s",
        str(max(heartbeat_s, 2.0)),
        *extra_args,
    ]
    return processes.start(f"worker {worker_id}", argv, directory / f"{worker_id}.log")


def worker_available() -> tuple[bool, str]:
    """Whether ``python -m corral worker --help`` works in this tree (the worker may not exist yet)."""
    try:
        done = subprocess.run(
            [PYTHON, "-m", "corral", "worker", "--help"], cwd=ROOT, capture_output=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return False, "python -m corral worker --help did not answer within 60s"
    if done.returncode != 0:
        return False, (done.stderr or done.stdout).decode(errors="replace").strip()[-800:]
    return True, ""


def _wait_accepting(server: Server, deadline: float) -> None:
    """The server prints its address once the socket is bound, before uvicorn calls ``listen()``:
    a connect in between is refused, so wait until one is accepted."""
    while True:
        try:
            socket.create_connection((server.host, server.port), timeout=1).close()
            return
        except ConnectionRefusedError:
            if server.child.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"server at {server.url} never accepted a connection:\n"
                    + server.child.log.read_text(errors="replace")[-3000:]
                ) from None
            time.sleep(0.01)


def print_profile(path: Path, limit: int = 30) -> None:
    """The server's cProfile stats: top functions by own time and by cumulative time."""
    import pstats

    if not path.exists():
        print(f"(no profile written at {path})")
        return
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"\nserver profile ({path}), total {total:.2f}s of CPU in the profiled thread")
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds a process has used so far (Linux ``/proc``); with ``children``,
    plus those of its descendants: the ones it has waited for (a worker's ended job processes) and
    the ones still running (its running jobs, the server's planner process)."""
    fields = _stat_fields(pid)
    if fields is None:
        return float("nan")
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
        for descendant in _live_descendants(pid):
            own = _stat_fields(descendant)
            if own is not None:
                ticks += int(own[11]) + int(own[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (field 3 on), or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _live_descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            parents[int(entry)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent:
                found.append(child)
                frontier.append(child)
    return found


def postgres_cpu_seconds() -> dict[int, float]:
    """CPU seconds of every PostgreSQL process on this machine, by pid (empty when none is local)."""
    result = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", encoding="ascii", errors="replace") as comm:
                name = comm.read().strip()
        except OSError:
            continue
        if name.startswith(("postgres", "postmaster")):
            result[int(entry)] = cpu_seconds(int(entry))
    return result


def postgres_cpu_delta(before: dict[int, float]) -> float:
    """CPU PostgreSQL used since ``before`` (processes that exited in between are not counted)."""
    after = postgres_cpu_seconds()
    return sum(value - before.get(pid, 0.0) for pid, value in after.items() if value == value)


def postgres_backends_of(pids: Sequence[int], port: int = 5432) -> list[int]:
    """The PostgreSQL backend processes serving connections that ``pids`` (and their descendants)
    hold to ``port``: a backend's title names its client's address, ``127.0.0.1(PORT)``, so the
    client's local TCP ports pick out this bench's backends from those of others sharing the
    database server (other benches, other test runs)."""
    owners = [pid for top in pids for pid in (top, *_live_descendants(top))]
    inodes: set[str] = set()
    for pid in owners:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    client_ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        for pid in owners[:1]:  # one network namespace: any process's view lists every socket
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                    fields = line.split()
                    local, remote, inode = fields[1], fields[2], fields[9]
                    if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == port:
                        client_ports.add(int(local.rsplit(":", 1)[1], 16))
    backends = []
    for pid in postgres_cpu_seconds():
        with contextlib.suppress(OSError):
            title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            if any(f"({client})" in title for client in client_ports):
                backends.append(pid)
    return backends


def self_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pyspy_path() -> str | None:
    candidate = Path(PYTHON).with_name("py-spy")
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


def start_pyspy(processes: Processes, pid: int, out: Path, rate: int = 250, gil: bool = False) -> Child:
    """Sample ``pid`` with py-spy (raw collapsed stacks, CPU-busy samples only) until ``stop_pyspy``.

    ``gil``: only the thread holding the GIL (the Python work of a many-threaded process such as the
    worker, where threads blocked in I/O would otherwise fill the samples)."""
    tool = pyspy_path()
    if tool is None:
        raise RuntimeError("py-spy is not installed: .venv/bin/pip install py-spy")
    argv = [
        tool,
        "record",
        "--pid",
        str(pid),
        "--rate",
        str(rate),
        "--format",
        "raw",
        "--nonblocking",
        "-o",
        str(out),
        *(["--gil"] if gil else []),
    ]
    child = processes.start("py-spy", argv, out.with_suffix(".log"))
    time.sleep(0.5)  # attached before the measured phase starts
    return child


def stop_pyspy(processes: Processes, child: Child) -> None:
    """py-spy writes its file on SIGINT."""
    if child.process.poll() is None:
        child.process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.process.wait(20)
    processes.stop(child, grace_s=1)


#: where a sample's time goes, by the first of these found on its stack (leaf first)
CATEGORIES = (
    ("logging", ("logging/__init__.py", "corral/observability/logging.py")),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    (
        "SQL execution (driver calls)",
        (
            "_SqliteTransaction.execute",
            "_SqliteTransaction.executemany",
            "_PostgresTransaction.execute",
            "_PostgresTransaction.executemany",
        ),
    ),
    (
        "transaction begin/commit",
        ("SqliteStore._transaction", "PostgresStore._transaction", "psycopg/transaction.py"),
    ),
    (
        "rows -> objects, JSON (store, wire)",
        (
            "job_from_row",
            "worker_from_row",
            "_allocation_from_row",
            "corral/protocol/wire.py",
            "corral/domain/",
            "json_response",
            "corral/core/",
        ),
    ),
    ("store Python (SQL building, other)", ("corral/store/",)),
    ("request validation (pydantic)", ("pydantic", "corral/protocol/models.py")),
    ("corral routes/middleware (other)", ("corral/server/",)),
    ("HTTP stack (uvicorn, starlette)", ("uvicorn/", "starlette/", "httptools")),
    ("event loop / other", ("",)),
)


def _category(frames: list[str]) -> str:
    """The category of the frame nearest the top of the stack that belongs to one."""
    for frame in reversed(frames):
        for name, needles in CATEGORIES[:-1]:
            if any(needle in frame for needle in needles):
                return name
    return CATEGORIES[-1][0]


def print_collapsed(path: Path, top: int = 25, title: str = "server") -> None:
    """Shares of the server's CPU samples: by category, per corral function inclusive (on the
    stack), and per function self (leaf)."""
    if not path.exists():
        print(f"(no py-spy output at {path})")
        return
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    categories: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        frames = [frame for frame in frames if not frame.startswith(("process ", "thread "))]
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + count
        category = _category(frames)
        categories[category] = categories.get(category, 0) + count
    if not total:
        print("(py-spy recorded no samples)")
        return
    print(f"\n{title} profile (py-spy, {total} CPU-busy samples of the {title} process, {path})")
    print("  by category (a sample counts once: the category of the frame nearest the top of its stack):")
    for name, _ in CATEGORIES:
        if categories.get(name):
            print(f"    {100 * categories[name] / total:5.1f}%  {name}")
    print("  corral functions, inclusive share (function anywhere on the stack):")
    corral = [(frame, count) for frame, count in inclusive.items() if "(corral/" in frame]
    for frame, count in sorted(corral, key=lambda item: -item[1])[:top]:
        if "corral/main.py" in frame or "corral/__main__.py" in frame or "corral/server/main.py" in frame:
            continue
        print(f"    {100 * count / total:5.1f}%  {frame}")
    print("  self share (function at the top of the stack):")
    for frame, count in sorted(own.items(), key=lambda item: -item[1])[:top]:
        print(f"    {100 * count / total:5.1f}%  {frame}")


# --- the HTTP client -------------------------------------------------------------------------


class HttpError(Exception):
    pass


class HttpConn:
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._host_line = f"Host: {host}:{port}\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def connect(self) -> HttpConn:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        return self

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._reader = self._writer = None

    async def request(self, method: bytes, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """Send one request, return ``(status, body)``."""
        if self._writer is None:
            await self.connect()
        assert self._reader is not None and self._writer is not None
        head = b"%s %s HTTP/1.1\r\n%s" % (method, path.encode(), self._host_line)
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            self._writer.write(head + body)
            if len(body) > 65536:
                await self._writer.drain()
        else:
            self._writer.write(head + b"\r\n")
        try:
            raw = await self._reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as error:
            await self.close()
            raise HttpError(f"connection closed by the server during {method.decode()} {path}") from error
        status = int(raw[9:12])
        lower = raw.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at >= 0:
            length = int(lower[at + 17 : lower.index(b"\r\n", at + 2)])
            content = await self._reader.readexactly(length) if length else b""
        elif b"\r\ntransfer-encoding: chunked" in lower:
            content = await self._read_chunked()
        else:
            content = b""
        if b"\r\nconnection: close" in lower:
            await self.close()
        return status, content

    async def _read_chunked(self) -> bytes:
        assert self._reader is not None
        parts: list[bytes] = []
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await self._reader.readexactly(size))
            await self._reader.readexactly(2)

    async def json(self, method: bytes, path: str, body: bytes | None = None, expect: int = 200) -> Any:
        import orjson

        status, content = await self.request(method, path, body)
        if status != expect:
            raise HttpError(f"{method.decode()} {path}: {status} {content[:300]!r}")
        return orjson.loads(content) if content else None


def new_event_loop_policy() -> None:
    """uvloop for the client too when it is installed (it is, with uvicorn[standard])."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def metric(text: str, name: str, labels: str = "") -> float:
    """A sample of the Prometheus text ``/metrics`` returns (0 when absent)."""
    pattern = re.compile(rf"^{re.escape(name)}{re.escape(labels)}\s+(\S+)$", re.MULTILINE)
    match = pattern.search(text)
    return float(match.group(1)) if match else 0.0


async def count_jobs(conn: HttpConn, status: str, page: int = 5000) -> int:
    """How many jobs have ``status``, following the list cursor."""
    total = 0
    after = None
    while True:
        path = f"/jobs?status={status}&limit={page}" + (f"&after={after}" if after else "")
        answer = await conn.json(b"GET", path)
        total += len(answer["items"])
        after = answer["next"]
        if not after:
            return total


async def list_jobs(conn: HttpConn, query: str = "", page: int = 5000) -> list[dict[str, Any]]:
    """Every job (``query``: extra filters such as ``status=done``), following the cursor."""
    items: list[dict[str, Any]] = []
    after = None
    while True:
        path = f"/jobs?limit={page}" + (f"&{query}" if query else "") + (f"&after={after}" if after else "")
        answer = await conn.json(b"GET", path)
        items += answer["items"]
        after = answer["next"]
        if not after:
            return items


async def wait_workers(
    conn: HttpConn, worker_ids: Sequence[str], processes: Processes, timeout_s: float = 30.0
) -> None:
    """Until every worker of ``worker_ids`` is registered and active (a worker that exits fails it)."""
    deadline = time.monotonic() + timeout_s
    wanted = set(worker_ids)
    while True:
        answer = await conn.json(b"GET", "/workers")
        active = {item["id"] for item in answer["items"] if item["status"] == "active"}
        if wanted <= active:
            return
        for child in processes.children:
            if child.name.startswith("worker ") and child.process.poll() is not None:
                raise RuntimeError(
                    f"{child.name} exited with {child.process.returncode}:\n"
                    + child.log.read_text(errors="replace")[-2000:]
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers not registered after {timeout_s:.0f}s: {sorted(wanted - active)}")
        await asyncio.sleep(0.05)


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 UTC time of the API (``...Z``) as a Unix timestamp."""
    if not text:
        return None
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def wait_ready(conn: HttpConn, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status, _ = await conn.request(b"GET", "/readyz")
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise HttpError(f"server not ready after {timeout_s:.0f}s (last {status})")
        await asyncio.sleep(0.05)


# --- figures ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def figure(label: str, value: float, unit: str, target: float | None = None, at_least: bool = True) -> str:
    """One line: the figure, its target, PASS or BELOW."""
    line = f"  {label:<48} {value:>10.1f} {unit:<8}"
    if target is None:
        return line
    ok = value >= target if at_least else value < target
    goal = f">= {target:g}" if at_least else f"< {target:g}"
    return f"{line} target {goal:<9} {'PASS' if ok else 'BELOW'}"


def banner(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


# --- the spawn ceiling -----------------------------------------------------------------------


def spawn_ceiling(seconds: float = 2.0, threads: int = 2, command: str = "true") -> float:
    """How many ``/bin/sh -c COMMAND`` processes Python spawns and reaps per second, with ``threads``
    threads each doing ``Popen`` + ``wait`` in a loop for ``seconds``: the most a worker (one Python
    process) could ever start and reap on this machine, whatever the scheduler does. Spawned as the
    worker spawns a job: its own session, no inherited descriptors; output to /dev/null."""
    import threading

    counts = [0] * threads
    stop = time.monotonic() + seconds

    def spawn(index: int) -> None:
        while time.monotonic() < stop:
            child = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
            child.wait()
            counts[index] += 1

    started = time.monotonic()
    pool = [threading.Thread(target=spawn, args=(index,)) for index in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(counts) / (time.monotonic() - started)


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def store_port(store: Any, name: str) -> Any:
    """The store's port ``name`` (``store.claims``, ``store.workers``...), or the store itself on a
    commit from before the ports (a before/after run with ``PYTHONPATH`` at an older tree)."""
    return getattr(store, name) if hasattr(store, "claims") else store
