"""A kvstore get asked on the data connection (shared/kvpool/block_fetch.py: AskingFetcher) that
gets no answer is a miss within the fetcher's timeout, and leaves nothing expected."""

from __future__ import annotations

import asyncio
import socket
import time

import torch

from shared.kvblocks import BlockLayout
from shared.kvcache.storage import KVStorage
from shared.kvpool.block_fetch import AskingFetcher
from shared.transfer.inbox import KVInbox
from shared.transfer.tcp import TcpKVReceiver
from shared.transfer.tcp.asker import Asker


async def test_a_kvstore_that_never_answers_is_a_miss_within_the_timeout() -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never says HELLO
    storage = KVStorage(2, 4, 4, 2, 8, torch.float32)
    inbox = KVInbox(storage, asyncio.get_running_loop())
    asker = Asker(TcpKVReceiver(inbox, "127.0.0.1", 0), connect_timeout_s=5.0)
    fetcher = AskingFetcher(asker, inbox, BlockLayout.of(storage), timeout=0.3)
    try:
        began = time.monotonic()
        host, port = silent.getsockname()
        assert await fetcher.fetch(f"{host}:{port}", "t1", [11, 12], [0, 1]) is None
        assert time.monotonic() - began < 2.0  # the timeout, not the 5 s handshake's
        assert len(inbox) == 0
    finally:
        asker.close()
        silent.close()
