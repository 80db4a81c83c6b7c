"""No log line carries a job's environment or a token, even when a caller passes one as a field."""

from __future__ import annotations

import io
import logging

import orjson

from corral.observability.logging import HIDDEN, configure_logging


def test_secret_fields_are_hidden_from_log_lines():
    stream = io.StringIO()
    root = logging.getLogger("corral")
    saved = (root.handlers[:], root.level, root.propagate)
    configure_logging("info", stream)
    try:
        logging.getLogger("corral.test").info(
            "claimed", extra={"job_id": "j-1", "env": {"API_KEY": "s3cret"}, "token": "tok-1", "Cookie": "c"}
        )
    finally:
        root.handlers[:], root.level, root.propagate = saved
    line = orjson.loads(stream.getvalue().splitlines()[-1])
    assert line["job_id"] == "j-1"
    assert (line["env"], line["token"], line["Cookie"]) == (HIDDEN, HIDDEN, HIDDEN)
    assert "s3cret" not in stream.getvalue() and "tok-1" not in stream.getvalue()
