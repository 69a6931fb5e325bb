"""Receiver and sender factories that stop their sockets and threads after each test."""
from __future__ import annotations

import pytest

from shared.transfer.tcp import TcpKVReceiver, TcpKVSender


@pytest.fixture
def make_receiver():
    receivers = []

    def make(sink, **kwargs) -> tuple[TcpKVReceiver, str]:
        receiver = TcpKVReceiver(sink, host="127.0.0.1", **kwargs)
        receivers.append(receiver)
        return receiver, receiver.start()
    yield make
    for receiver in receivers:
        receiver.stop()


@pytest.fixture
def make_sender():
    senders = []

    def make(**kwargs) -> TcpKVSender:
        senders.append(TcpKVSender(**kwargs))
        return senders[-1]
    yield make
    for sender in senders:
        sender.close()
