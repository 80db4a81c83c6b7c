"""Short random ids: never sequence numbers, so replicas never collide and ids leak no counts."""

from __future__ import annotations

import secrets


def _random_suffix() -> str:
    # 64 random bits: collisions are negligible at any queue size corral will see.
    return secrets.token_hex(8)


def new_job_id() -> str:
    return "j-" + _random_suffix()


def new_gang_id() -> str:
    return "g-" + _random_suffix()


def new_array_id() -> str:
    return "a-" + _random_suffix()


def new_worker_id() -> str:
    return "w-" + _random_suffix()
