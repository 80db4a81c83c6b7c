"""``GET /openapi.json``: every route of the app is described, from the protocol models, with the
error envelope; the document is valid OpenAPI 3.1 (Schemathesis loads it: test_schemathesis.py)."""

from __future__ import annotations

import re

from starlette.routing import Route

from corral.protocol.answers import JobAnswer
from corral.protocol.models import SubmitBody
from corral.server.app import DESCRIBED, create_app


def app_routes(app) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves (HEAD, which Starlette adds to GET, left out)."""
    found = set()
    for route in app.routes:
        assert isinstance(route, Route), route
        for method in route.methods or ():
            if method != "HEAD":  # "{path:path}" is "{path}" in OpenAPI's templating
                found.add((method, re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)))
    return found


def test_every_route_of_the_app_is_in_the_document(server, api):
    document = api.get("/openapi.json").json()
    described = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    served = app_routes(server.app)
    assert served - described == set(), "routes without a description: declare an Operation beside them"
    assert described - served == set(), "described routes the app does not serve"
    assert len({(operation.method, operation.path) for operation in DESCRIBED}) == len(DESCRIBED)


def test_the_document_is_generated_from_the_models_with_the_error_envelope(api):
    document = api.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    schemas = document["components"]["schemas"]
    assert set(SubmitBody.model_json_schema()["properties"]) == set(schemas["SubmitBody"]["properties"])
    assert set(schemas["JobAnswer"]["properties"]) >= set(JobAnswer.model_fields) - {"from_status"}
    submit = document["paths"]["/jobs"]["post"]
    assert submit["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SubmitBody"
    }
    error = {"$ref": "#/components/schemas/ErrorAnswer"}
    assert submit["responses"]["400"]["content"]["application/json"]["schema"] == error
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert "500" in operation["responses"], (method, path)
            assert operation["operationId"]
    assert schemas["ErrorAnswer"]["properties"]["error"] == {"$ref": "#/components/schemas/ErrorDetail"}


def test_an_app_built_anew_describes_the_same_routes(store):
    assert app_routes(create_app(store, run_loops=False)) == {
        (operation.method, operation.path) for operation in DESCRIBED
    }
