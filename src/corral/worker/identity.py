"""Who a job runs as on its host, what of the host's environment it gets, and where it starts.

The environment (API.md "A job is contained on its host"): ``PATH``, ``LANG``, ``LC_*`` and ``TZ``
from the worker's, the account's ``HOME``, ``USER``, ``LOGNAME`` and ``SHELL``, then the job's
``env``, then corral's variables. Nothing else of the worker's: its ``CORRAL_TOKEN`` once let any
job act as its worker (claim another user's job, read her secrets, report her job done).

The workdir: the job starts in its submitter's directory (``workdir``), which the account must be
able to enter; the check is made here, by the permission bits of every directory on the way, for
the account's uid and groups, since the worker (root, to start jobs as their users) can enter
anything itself and the ``chdir`` of the job's start runs before it takes the account's identity.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

logger = logging.getLogger("corral.worker.identity")

#: what a job gets of its worker's own environment (besides the account's HOME, USER, LOGNAME,
#: SHELL); every ``LC_*`` too
PASSED_THROUGH = ("PATH", "LANG", "TZ")


@dataclass(frozen=True, slots=True)
class Account:
    """A Unix account a job runs as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str
    umask: int = 0o022


def _account_of(entry: pwd.struct_passwd, groups: tuple[int, ...]) -> Account:
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir, entry.pw_shell)


@cache
def worker_account() -> Account:
    """The account the worker runs as (jobs run as it without authentication)."""
    uid = os.getuid()
    groups = tuple(sorted({os.getgid(), *os.getgroups()}))
    try:
        return _account_of(pwd.getpwuid(uid), groups)
    except KeyError:  # a uid without a passwd entry (some containers)
        return Account(str(uid), uid, os.getgid(), groups, os.environ.get("HOME", "/"), "/bin/sh")


def base_environment(account: Account, worker_environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a job gets before its own ``env``: see the module docstring."""
    source = os.environ if worker_environment is None else worker_environment
    environment = {
        name: value for name, value in source.items() if name in PASSED_THROUGH or name.startswith("LC_")
    }
    environment.setdefault("PATH", os.defpath)
    environment["HOME"] = account.home
    environment["USER"] = account.name
    environment["LOGNAME"] = account.name
    environment["SHELL"] = account.shell
    return environment


def _may(status: os.stat_result, account: Account, bits: tuple[int, int, int]) -> bool:
    """Whether ``account`` has the permission of ``bits`` (owner, group, other) on the file."""
    if account.uid == 0:
        return True
    if status.st_uid == account.uid:
        return bool(status.st_mode & bits[0])
    if status.st_gid == account.gid or status.st_gid in account.groups:
        return bool(status.st_mode & bits[1])
    return bool(status.st_mode & bits[2])


def unenterable(path: str, account: Account) -> str | None:
    """Why ``account`` cannot start in ``path`` (a sentence), or None when it can: the path must be
    an absolute directory, and every directory from ``/`` down must let the account through."""
    if not os.path.isabs(path):
        return f"workdir {path!r} is not an absolute path"
    try:
        real = os.path.realpath(path, strict=True)
    except OSError as error:
        return f"workdir {path!r}: {error.strerror or error}"
    current = "/"
    for part in [""] + [part for part in real.split("/") if part]:
        current = os.path.join(current, part) if part else current
        try:
            status = os.stat(current)
        except OSError as error:
            return f"workdir {path!r}: {current}: {error.strerror or error}"
        if not stat.S_ISDIR(status.st_mode):
            return f"workdir {path!r}: {current} is not a directory"
        if not _may(status, account, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)):
            return f"workdir {path!r}: account {account.name} may not enter {current}"
    return None


class NoSuchAccount(Exception):
    """The job's user has no account on this host (reason ``no_such_account``: not retried)."""


def login_umask(path: str = "/etc/login.defs") -> int:
    """The accounts' umask: ``UMASK`` of ``/etc/login.defs`` (what a login gets), else 022."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return 0o022
    match = re.search(r"^\s*UMASK\s+([0-7]{3,4})\s*$", text, re.MULTILINE)
    return int(match.group(1), 8) if match else 0o022


def parse_user_map(setting: str | None) -> dict[str, str]:
    """``CORRAL_USER_MAP``: a file of ``NAME UNIX_ACCOUNT`` lines, or those lines themselves (a
    comma also ends one); ``#`` starts a comment. A corral user it does not name is the account of
    the same name."""
    if not setting:
        return {}
    path = Path(setting)
    text = path.read_text() if "\n" not in setting and " " not in setting and path.is_file() else setting
    mapping = {}
    for raw in re.split(r"[\n,]", text):
        fields = raw.split("#", 1)[0].split()
        if len(fields) == 2:
            mapping[fields[0]] = fields[1]
        elif fields:
            logger.warning("CORRAL_USER_MAP line skipped: expected NAME UNIX_ACCOUNT", extra={"line": raw})
    return mapping


class Accounts:
    """Who each job runs as on this worker: ``switching`` (a root worker whose server has auth,
    so every job has a user the token vouched for): the account of the job's ``user``, mapped by
    ``user_map``; else the worker's own account."""

    def __init__(self, switching: bool, user_map: Mapping[str, str] | None = None) -> None:
        self.switching = switching
        self._map = dict(user_map or {})
        self._umask = login_umask() if switching else 0o022

    @property
    def enforcement(self) -> str:
        """API.md's ``enforcement.identity``: ``setuid`` (each job as its user's account) or ``none``."""
        return "setuid" if self.switching else "none"

    def of(self, user: str | None) -> Account:
        """The account a job of ``user`` runs as; raises ``NoSuchAccount``."""
        if not self.switching:
            return worker_account()
        if not user:
            raise NoSuchAccount("the job has no user to run as")
        name = self._map.get(user, user)
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            mapped = f" (mapped from {user!r} by CORRAL_USER_MAP)" if name != user else ""
            raise NoSuchAccount(f"no account {name!r}{mapped} on this host") from None
        groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
        account = _account_of(entry, groups)
        return Account(
            account.name, account.uid, account.gid, groups, account.home, account.shell, self._umask
        )

    def is_worker(self, account: Account) -> bool:
        return account.uid == os.getuid()
