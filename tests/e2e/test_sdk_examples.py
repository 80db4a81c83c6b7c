"""Every example in the SDK's docstrings (``corral.client``, ``corral.handles``,
``corral.connection``) runs, against a real server and two real workers, and prints what its
docstring says it prints.

An example reads ``corral``, a ``Client`` connected to that server. Each docstring is one test, so
a failure names the call whose documentation went wrong; ``...`` in an expected output stands for
what changes from run to run (ids, times).
"""

from __future__ import annotations

import doctest
import io
from collections.abc import Iterator

import pytest

import corral.client
import corral.connection
import corral.handles
from corral.client import ArrayHandle, Client, GangHandle, JobHandle
from corral.connection import Connection
from tests.e2e.sdk_cluster import running_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EXAMPLES = [
    test
    for module in (corral.client, corral.handles, corral.connection)
    for test in doctest.DocTestFinder().find(module)
    if test.examples
]


@pytest.fixture(scope="module")
def connected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    with running_cluster(tmp_path_factory.mktemp("sdk-examples")) as url, Client(url) as client:
        yield client


def test_every_public_call_has_an_example():
    """Each public method and property of the client and the handles shows how it is called."""
    documented = {test.name for test in EXAMPLES}
    calls = [
        f"{cls.__module__}.{cls.__name__}.{name}"
        for cls in (Connection, Client, JobHandle, GangHandle, ArrayHandle)
        for name, value in vars(cls).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    ]
    assert len(calls) > 50
    assert [call for call in calls if call not in documented] == ["corral.connection.Connection.close"]


@pytest.mark.parametrize("example", EXAMPLES, ids=[test.name.removeprefix("corral.") for test in EXAMPLES])
def test_the_docstring_example_runs_as_written(example: doctest.DocTest, connected: Client):
    example.globs = {**example.globs, "corral": connected}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    runner.run(example, out=report.write)
    assert runner.failures == 0, report.getvalue()
