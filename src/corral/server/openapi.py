"""``GET /openapi.json``: the OpenAPI 3.1 description of every route, generated from the models the
server validates with.

Each route is described by one ``Operation`` declared beside it, in its routes module
(``routes.jobs.described``...): its method and path, the request body's model (a
``corral.protocol.models`` class, raw bytes, or none), its query parameters, and its answers by
status code (a ``corral.protocol.answers`` class, or a media type for text and bytes). Schemas come
from pydantic's JSON Schema of those models, so the description cannot drift from what the server
accepts and answers. Every error answer is the one envelope (``ErrorAnswer``).

A route without a declaration is a defect: ``tests/api/test_openapi.py`` enumerates the app's routes
and fails on any that is missing here. Adding a route is one more ``Operation`` beside it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from corral import __version__
from corral.protocol.answers import ErrorAnswer

#: a raw-bytes request body (checkpoints, log chunks)
BYTES = "application/octet-stream"
TEXT = "text/plain"
HTML = "text/html"
PROMETHEUS = "text/plain; version=0.0.4"

ERRORS: dict[int, str] = {
    400: "invalid_request: malformed JSON, a missing or out-of-range field (the message names it)",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method not allowed on this path",
    409: "the state, attempt or epoch does not allow it: not_running, stale_attempt, stale_epoch, "
    "not_preempting, already_terminal, conflict",
    413: "too_large: the body is over its limit",
    500: "internal: an unexpected fault (the message carries the request id; never a stack trace)",
    503: "unavailable: the store does not answer",
}


@dataclass(frozen=True)
class Param:
    """A query parameter: its JSON Schema and whether it is required."""

    name: str
    schema: dict[str, Any]
    description: str = ""
    required: bool = False


def integer(name: str, description: str = "", required: bool = False, minimum: int | None = None) -> Param:
    schema: dict[str, Any] = {"type": "integer"}
    if minimum is not None:
        schema["minimum"] = minimum
    return Param(name, schema, description, required)


def string(name: str, description: str = "", required: bool = False, **schema: Any) -> Param:
    return Param(name, {"type": "string", **schema}, description, required)


def number(
    name: str, description: str = "", minimum: float | None = None, maximum: float | None = None
) -> Param:
    schema: dict[str, Any] = {"type": "number"}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return Param(name, schema, description)


#: ``worker_id`` and ``attempt`` of every report of the job protocol (the fence)
FENCE = (
    string("worker_id", "the worker the claim went to", required=True, minLength=1),
    integer("attempt", "the attempt the claim returned", required=True),
)

#: a model (JSON), several (any of them), a media type (text, bytes, HTML) or None (no content)
Answer = type[BaseModel] | tuple[type[BaseModel], ...] | tuple[str, ...] | str | None


@dataclass(frozen=True)
class Operation:
    """One route as the description shows it.

    ``body``: a model (a JSON object body), ``BYTES`` (raw bytes) or None; ``body_required``: False
    for a body that may be left out. ``answers``: status -> a model (JSON), a media type (text,
    bytes, HTML) or None (no content). ``errors``: the error statuses the route answers (the
    envelope), besides 400 and 500 which every route may.
    """

    method: str
    path: str
    summary: str
    tag: str
    answers: dict[int, Answer]
    body: type[BaseModel] | str | None = None
    body_required: bool = True
    query: Sequence[Param] = ()
    errors: Sequence[int] = (400,)
    headers: Sequence[Param] = ()
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _path_parameters(path: str) -> list[dict[str, Any]]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]
    return [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        for name in names
    ]


def _content(answer: Answer, refs: dict[type[BaseModel], dict[str, Any]]) -> dict[str, Any] | None:
    if answer is None:
        return None
    if isinstance(answer, str):
        schema: dict[str, Any] = (
            {"type": "string", "format": "binary"} if answer == BYTES else {"type": "string"}
        )
        return {answer: {"schema": schema}}
    if isinstance(answer, tuple) and all(isinstance(media_type, str) for media_type in answer):
        return {
            media_type: {"schema": {"type": "string"}} for media_type in answer if isinstance(media_type, str)
        }
    if isinstance(answer, tuple):
        return {
            "application/json": {
                "schema": {"anyOf": [refs[model] for model in answer if isinstance(model, type)]}
            }
        }
    return {"application/json": {"schema": refs[answer]}}


def _models(operations: Iterable[Operation]) -> list[type[BaseModel]]:
    seen: dict[type[BaseModel], None] = {ErrorAnswer: None}
    for operation in operations:
        if isinstance(operation.body, type):
            seen[operation.body] = None
        for answer in operation.answers.values():
            for model in answer if isinstance(answer, tuple) else (answer,):
                if isinstance(model, type):
                    seen[model] = None
    return list(seen)


def build(operations: Sequence[Operation], title: str = "corral") -> dict[str, Any]:
    """The OpenAPI 3.1 document for ``operations``."""
    models = _models(operations)
    keys, definitions = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    refs = {model: keys[(model, "validation")] for model in models}
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        responses: dict[str, Any] = {}
        for status, answer in sorted(operation.answers.items()):
            response: dict[str, Any] = {"description": _describe_status(status, answer)}
            content = _content(answer, refs)
            if content is not None:
                response["content"] = content
            responses[str(status)] = response
        # 400 (a NUL in the path or query is refused before any route) and 500: any route
        for status in sorted({*operation.errors, 400, 500}):
            responses.setdefault(
                str(status),
                {"description": ERRORS.get(status, "error"), "content": _content(ErrorAnswer, refs)},
            )
        item: dict[str, Any] = {
            "operationId": _operation_id(operation),
            "summary": operation.summary,
            "tags": [operation.tag],
            "responses": responses,
        }
        if operation.description:
            item["description"] = operation.description
        parameters = _path_parameters(operation.path)
        parameters += [
            {
                "name": param.name,
                "in": "query",
                "required": param.required,
                "schema": param.schema,
                **({"description": param.description} if param.description else {}),
            }
            for param in operation.query
        ]
        parameters += [
            {"name": param.name, "in": "header", "required": param.required, "schema": param.schema}
            for param in operation.headers
        ]
        if parameters:
            item["parameters"] = parameters
        if operation.body is not None:
            body_content = _content(operation.body, refs)
            item["requestBody"] = {"required": operation.body_required, "content": body_content}
        item.update(operation.extra)
        paths.setdefault(operation.path, {})[operation.method.lower()] = item
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": __version__,
            "description": "corral, a job scheduler for GPU clusters: the wire contract (shared/API.md).",
        },
        "paths": paths,
        "components": {"schemas": definitions.get("$defs", {})},
    }


def _describe_status(status: int, answer: Answer) -> str:
    if status == 204:
        return "nothing (no content)"
    models = answer if isinstance(answer, tuple) else (answer,)
    if all(isinstance(model, type) for model in models):
        return " / ".join(
            (model.__doc__ or model.__name__).strip().splitlines()[0]
            for model in models
            if isinstance(model, type)
        )
    return "OK"


def _operation_id(operation: Operation) -> str:
    words = [part.strip("{}").replace("_", " ") for part in operation.path.strip("/").split("/") if part] or [
        "root"
    ]
    text = f"{operation.method.lower()} {' '.join(words)}"
    return "".join(
        word if index == 0 else word[:1].upper() + word[1:] for index, word in enumerate(text.split())
    )
