"""Moving a job's checkpoint between its workspace and the server: bytes end to end, never text.

Why the worker carries checkpoints and not the job: a job only writes one file
(``CORRAL_CHECKPOINT_OUT``) and reads another (``CORRAL_CHECKPOINT_IN``). It needs no HTTP client,
no token, no idea of attempts or preemption epochs, and a shell job can checkpoint with ``cat``.

The upload happens after the job's process group is gone, so nothing can still be writing the
file, and before the ``/preempted`` ack: the ack may be the one that completes the gang's drain,
after which the next attempt can be claimed at once, and its claim must find the checkpoint
stored. A refused upload (413 too large, 409 stale epoch) is logged and the ack still goes: a gang
that restarts from an older checkpoint (or from scratch) is better than a gang stuck in its drain.

The download happens before the process starts, when the claim says ``CORRAL_RESUME=1``. The
server's copy is the source (it has no size limit but the server's); the claim's inline
``CHECKPOINT_DATA`` (small checkpoints only) is the fallback when the server cannot be reached.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.client import Client
from corral.worker.reporting import deliver

logger = logging.getLogger("corral.worker.checkpoints")

#: A transfer is tried this many times (backoff 0.5, 1, 2 s): a stopping job's ack, and a starting
#: job's process, should not wait long for a server that does not answer.
TRANSFER_TRIES = 4
#: A checkpoint file larger than this is not read into the worker's memory to be uploaded. The
#: server refuses anything above ``CORRAL_CHECKPOINT_MAX_BYTES`` (16 MiB by default) anyway; this
#: only keeps a runaway file from exhausting the worker's memory.
MAX_UPLOAD_BYTES = 1 << 30


def read_written(path: Path, fields: Mapping[str, Any]) -> bytes | None:
    """The checkpoint the job left at ``path``; None when it wrote none (absent or empty file)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    except OSError as error:
        logger.warning("cannot read the job's checkpoint", extra={**fields, "error": str(error)})
        return None
    if size == 0:
        return None
    if size > MAX_UPLOAD_BYTES:
        logger.error(
            "the job's checkpoint is too large to upload; dropped",
            extra={**fields, "bytes": size, "max_bytes": MAX_UPLOAD_BYTES},
        )
        return None
    try:
        return path.read_bytes() or None
    except OSError as error:
        logger.warning("cannot read the job's checkpoint", extra={**fields, "error": str(error)})
        return None


def upload(
    client: Client,
    job_id: str,
    worker_id: str,
    attempt: int,
    epoch: int,
    path: Path,
    fields: Mapping[str, Any],
    tries: int = TRANSFER_TRIES,
) -> bool:
    """Upload the checkpoint the stopped job wrote at ``path``, for preemption ``epoch``.

    True when the server stored it; False when there was none or the upload failed (logged).
    """
    data = read_written(path, fields)
    if data is None:
        return False
    fields = {**fields, "preemption_epoch": epoch, "bytes": len(data)}

    def send() -> dict[str, Any]:
        client.upload_checkpoint(job_id, worker_id, attempt, epoch, data)
        return {}

    stored = deliver(send, "checkpoint upload", fields, tries=tries) is not None
    if stored:
        logger.info("checkpoint uploaded", extra=fields)
    return stored


def download(
    client: Client,
    job_id: str,
    claim_env: Mapping[str, str],
    destination: Path,
    fields: Mapping[str, Any],
    tries: int = TRANSFER_TRIES,
) -> bool:
    """Write the job's stored checkpoint to ``destination`` when the claim says there is one.

    True when ``destination`` now holds it; False when the job starts without one (no checkpoint
    stored, or neither the server nor the claim's ``CHECKPOINT_DATA`` could provide it).
    """
    if claim_env.get("CORRAL_RESUME") != "1":
        return False

    def fetch() -> dict[str, Any]:
        return {"data": client.download_checkpoint(job_id)}

    answer = deliver(fetch, "checkpoint download", fields, tries=tries)
    data: bytes | None = answer["data"] if answer is not None else None
    source = "server"
    if data is None:
        data = _inline(claim_env, fields)
        source = "claim"
    if data is None:
        logger.warning("resuming without a checkpoint: none could be fetched", extra=fields)
        return False
    destination.write_bytes(data)
    logger.info("checkpoint downloaded", extra={**fields, "bytes": len(data), "source": source})
    return True


def _inline(claim_env: Mapping[str, str], fields: Mapping[str, Any]) -> bytes | None:
    """The claim's ``CHECKPOINT_DATA`` decoded, or None (absent, empty or not base64)."""
    inline = claim_env.get("CHECKPOINT_DATA")
    if not inline:
        return None
    try:
        return base64.b64decode(inline, validate=True) or None
    except (binascii.Error, ValueError):
        logger.warning("CHECKPOINT_DATA is not valid base64; ignored", extra=fields)
        return None
