"""The connection book's arithmetic (``server.connections``): the limit fitted under the open-file
limit, refusals past the limit and past a client's share, and connections closed at accept once
even the room kept for answering refusals is taken."""

from __future__ import annotations

from corral.server.connections import FD_RESERVE, REFUSAL_ROOM, ConnectionBook, Refusal


def test_the_limit_fits_under_the_open_file_limit_with_a_reserve():
    book = ConnectionBook(max_connections=10_000, max_per_client=256)
    assert book.fit_descriptors(1024, in_use=20) == 1024 - 20 - FD_RESERVE - REFUSAL_ROOM
    assert ConnectionBook(100, 256).fit_descriptors(1 << 20, in_use=20) == 100, "never raised"


def test_past_the_limit_refused_then_past_the_room_closed_at_accept():
    book = ConnectionBook(max_connections=2, max_per_client=1000)
    served = [book.opened("10.0.0.1") for _ in range(2)]
    assert all(connection is not None and connection.refusal is None for connection in served)
    refused = [book.opened("10.0.0.2") for _ in range(REFUSAL_ROOM)]
    assert all(connection is not None and connection.refusal is Refusal.FULL for connection in refused)
    assert book.opened("10.0.0.3") is None
    assert book.figures() == (2 + REFUSAL_ROOM, 2, {"full": 0, "client_share": 0, "dropped": 1})
    for connection in [*served, *refused]:
        assert connection is not None
        book.closed(connection)
    assert (book.open, book.by_client) == (0, {})


def test_a_client_is_its_address_until_a_request_names_its_principal():
    book = ConnectionBook(max_connections=100, max_per_client=2)
    first, second, third = (book.opened("10.0.0.1") for _ in range(3))
    assert first is not None and second is not None and third is not None
    assert third.refusal is Refusal.CLIENT_SHARE, "three unidentified from one address"
    book.closed(third)
    assert book.identify(first, "user:alice") is None
    assert book.identify(second, "user:bob") is None
    again = book.opened("10.0.0.1")
    assert again is not None and again.refusal is None, "the address holds no unidentified one now"
    assert book.identify(again, "user:alice") is None
    late = book.opened("10.0.0.1")
    assert late is not None
    assert book.identify(late, "user:alice") is Refusal.CLIENT_SHARE
    assert book.by_client == {("10.0.0.1", "user:alice"): 3, ("10.0.0.1", "user:bob"): 1}
