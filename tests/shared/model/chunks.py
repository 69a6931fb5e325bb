"""A step's chunk as `attention_metadata` reads it, for attention tests: the attention wire's
own chunk, without a request."""

from __future__ import annotations

import functools

from shared.transfer.attention.wire import ChunkSpec

Chunk = functools.partial(ChunkSpec, "")
