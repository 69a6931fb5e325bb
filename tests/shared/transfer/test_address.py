"""A listener bound to every interface advertises this host's own address, not 0.0.0.0."""

from __future__ import annotations

import socket

from shared.transfer.address import advertised, own_address


def test_an_address_given_to_advertise_wins() -> None:
    assert advertised("0.0.0.0:9200", "decode-1:9200") == "decode-1:9200"


def test_a_bound_address_that_is_not_a_wildcard_is_advertised_as_it_is() -> None:
    assert advertised("127.0.0.1:9200") == "127.0.0.1:9200"


def test_a_wildcard_bind_advertises_the_address_the_host_name_resolves_to() -> None:
    expected = socket.gethostbyname(socket.gethostname())
    assert own_address() == expected
    assert advertised("0.0.0.0:9200") == f"{expected}:9200"
    assert advertised("[::]:9200") == f"{expected}:9200"
