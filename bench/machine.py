"""The machine a benchmark ran on: CPU model, cores, memory, Python, OS, date.

Every benchmark prints this block next to its figures, so a number is never read without the box it
came from. Runnable on its own: ``.venv/bin/python bench/machine.py``.
"""

from __future__ import annotations

import datetime
import os
import platform
import sqlite3
import sys


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return None


def _cpu_quota() -> str | None:
    """The cgroup v2 CPU limit, when one is set (a container may see more cores than it may use)."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="utf-8") as cpu_max:
            quota, period = cpu_max.read().split()
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return f"{int(quota) / int(period):.2f} CPUs"


def info() -> dict[str, str]:
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    memory = _memory_gib()
    quota = _cpu_quota()
    result = {
        "cpu": _cpu_model(),
        "cores": f"{cores} logical ({usable} usable by this process)"
        + (f", cgroup quota {quota}" if quota else ""),
        "memory": f"{memory:.1f} GiB" if memory is not None else "unknown",
        "python": f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        "os": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
    try:
        load1, load5, _ = os.getloadavg()
        result["load"] = f"{load1:.2f} (1 min), {load5:.2f} (5 min) before the run"
    except OSError:
        pass
    return result


def describe() -> str:
    lines = ["machine:"]
    lines += [f"  {key:<7} {value}" for key, value in info().items()]
    return "\n".join(lines)


def print_machine() -> None:
    print(describe(), flush=True)


if __name__ == "__main__":
    print_machine()
