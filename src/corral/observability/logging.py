"""JSON log lines: one object per line with ``time``, ``level``, ``logger``, ``message`` and the
fields passed as ``extra`` (``job_id``, ``worker_id``, ``gang_id``, ``preemption_epoch``, ...)."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
#: fields whose value never reaches a log line, whoever passes them: a job's environment often holds
#: credentials, and tokens are secrets (the code passes neither; this keeps a future line honest)
SECRET_FIELDS = frozenset({"env", "token", "authorization", "cookie", "claim_env"})
HIDDEN = "<hidden>"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")[:-6]
            + "Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(
            (key, HIDDEN if key.lower() in SECRET_FIELDS else value)
            for key, value in vars(record).items()
            if key not in _STANDARD and not key.startswith("_")
        )
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure_logging(level: str = "info", stream: Any = None) -> None:
    """Send every corral log line to ``stream`` (stderr) as JSON; idempotent."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("corral")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
