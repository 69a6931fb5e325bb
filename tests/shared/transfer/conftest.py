"""Receivers and senders that stop their sockets and threads after each test.

A test that takes `make_receiver` or `make_sender` runs once per transport (the Mooncake run
skipped where its engine cannot load); a module that tests one transport only defines its
own `transport` fixture.
"""

from __future__ import annotations

import pytest

from tests.shared.transfer.transports import TRANSPORTS, new_receiver, new_sender


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


@pytest.fixture
def make_receiver(transport):
    receivers = []

    def make(sink, **kwargs):
        if transport == "mooncake":  # the sink's memory registered up front, as workers do
            kwargs.setdefault("memory", [sink.storage.host()])
        receivers.append(new_receiver(transport, sink, **kwargs))
        return receivers[-1], receivers[-1].start()

    yield make
    for receiver in receivers:
        receiver.stop()


@pytest.fixture
def make_sender(transport):
    senders = []

    def make(**kwargs):
        senders.append(new_sender(transport, **kwargs))
        return senders[-1]

    yield make
    for sender in senders:
        sender.close()
