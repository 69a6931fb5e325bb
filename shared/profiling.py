"""Measurements of the real engine that `kvstack profile` fits: the wall time of a prefill,
of a decode step, and of moving KV over the TCP data plane.

The caller repeats each measurement (`kvstack profile` in rounds over its grid).
Outside shared.costmodel: it needs torch and the engine, and the engine's mock needs the
cost model, so inside it the two packages would import each other.
"""

from __future__ import annotations

import asyncio
import random
import time

from shared.engine.interface import EngineInterface
from shared.errors import KvstackError
from shared.kvcache.storage import KVStorage
from shared.sampling_params import SamplingParams
from shared.transfer.base import BlockSpan
from shared.transfer.inbox import KVInbox
from shared.transfer.tcp import TcpKVReceiver, TcpKVSender

FIRST_TOKEN = SamplingParams(max_tokens=1, temperature=0)


class Prompts:
    """Random token ids, never the same twice, so nothing hits the prefix cache by chance."""

    def __init__(self, vocab_size: int, seed: int | None = 0) -> None:
        self.vocab_size = vocab_size  # None: a seed from the OS, new every run
        self.rng = random.Random(seed)

    def fresh(self, num_tokens: int) -> list[int]:
        return [self.rng.randrange(self.vocab_size) for _ in range(num_tokens)]


class EngineProbe:
    """Times single runs of the engine, with fresh prompts each time."""

    def __init__(self, engine: EngineInterface, seed: int = 0) -> None:
        self.engine = engine
        self.prompts = Prompts(engine.info.model.vocab_size, seed)
        self.prefixes: dict[int, list[int]] = {}

    def prefill(self, num_new: int, num_cached: int) -> float:
        """A request's wall time to its first token: `num_new` fresh tokens computed after
        `num_cached` (a multiple of the block size) found in the prefix cache."""
        if num_cached not in self.prefixes:
            self.prefixes[num_cached] = self.prompts.fresh(num_cached)
        prefix = self.prefixes[num_cached]
        if num_cached:  # cached by an earlier run unless evicted since: then computed here
            self.engine.generate([prefix + self.prompts.fresh(1)], FIRST_TOKEN)
        start = time.perf_counter()
        done = self.engine.generate([prefix + self.prompts.fresh(num_new)], FIRST_TOKEN)[0]
        elapsed = time.perf_counter() - start
        if done.num_cached_tokens != num_cached:
            raise KvstackError(
                f"profile expected {num_cached} cached tokens, the engine "
                f"found {done.num_cached_tokens}; is the prefix cache on?"
            )
        return elapsed

    def decode_step(self, batch_size: int, context: int, steps: int = 6) -> float:
        """The quickest of `steps` decode steps (a hiccup spoils one) of `batch_size`
        requests with `context` tokens of KV each."""
        self._install(batch_size, context, steps)
        times = []
        while self.engine.has_unfinished:
            start = time.perf_counter()
            self.engine.step()
            times.append(time.perf_counter() - start)
        return min(times)

    def _install(self, batch_size: int, context: int, steps: int) -> None:
        """Requests whose KV is installed as a decode worker adopts a prefilled request's:
        reserved, not computed (its values do not change the time)."""
        engine = self.engine
        blocks = batch_size * -(-(context + steps + 1) // engine.info.block_size)
        if blocks > engine.stats().free_blocks:
            raise KvstackError(f"the KV cache cannot hold {batch_size} x {context} tokens")
        params = SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True)
        for i in range(batch_size):
            engine.install(f"profile-decode-{i}", self.prompts.fresh(context), 0, params)


def link_seconds(source: KVStorage, num_blocks: int, repeats: int = 3) -> tuple[float, float]:
    """Bytes/s and seconds per transfer of the TCP data plane over loopback, between two
    storages in this process (the receiver's threads land bytes as a decode worker's do)."""
    num_blocks = min(num_blocks, source.num_blocks)
    return asyncio.run(_link_seconds(source, num_blocks, repeats))


async def _link_seconds(source: KVStorage, num_blocks: int, repeats: int) -> tuple[float, float]:
    layers, _, _, block_size, heads, dim = source.kv.shape
    inbox = KVInbox(
        KVStorage(layers, num_blocks, block_size, heads, dim, source.kv.dtype),
        asyncio.get_running_loop(),
    )
    receiver, sender = TcpKVReceiver(inbox, "127.0.0.1", 0), TcpKVSender()
    link = _Link(source, inbox, sender, receiver.start())
    try:
        await link.send(num_blocks)  # connects, and warms both ends up
        # NOTE: the least of a few: these take milliseconds, and a hiccup can double one.
        small = min([await link.send(1) for _ in range(repeats)])
        large = min([await link.send(num_blocks) for _ in range(repeats)])
    finally:
        sender.close()
        receiver.stop()
    extra_bytes = (num_blocks - 1) * link.block_bytes
    bandwidth = extra_bytes / max(large - small, 1e-6)
    return bandwidth, max(0.0, small - link.block_bytes / bandwidth)


class _Link:
    """Sends the first blocks of `source`, every layer, as one request, and waits for them."""

    def __init__(self, source: KVStorage, inbox: KVInbox, sender: TcpKVSender, peer: str) -> None:
        self.source, self.inbox, self.sender, self.peer = source, inbox, sender, peer
        self.num_layers = source.kv.shape[0]
        self.block_bytes = 2 * source.block_size * source.token_bytes * self.num_layers
        self.count = 0

    async def send(self, num_blocks: int) -> float:
        self.count += 1
        name, num_tokens = f"profile-link-{self.count}", num_blocks * self.source.block_size
        expected = self.inbox.expect(name, list(range(num_blocks)), self.num_layers, 60)
        start = time.perf_counter()
        for layer in range(self.num_layers):
            kv = self.source.span_bytes(layer, 0, 0, num_tokens)
            self.sender.send(self.peer, name, layer, [(BlockSpan(0, 0, num_tokens), *kv)])
        self.sender.finish(self.peer, name, lambda *_: None)
        await asyncio.wait_for(expected.settled.wait(), 60)
        elapsed = time.perf_counter() - start
        self.inbox.take(name)
        if error := expected.verdict():
            raise KvstackError(f"the data plane test transfer failed: {error}")
        return elapsed
