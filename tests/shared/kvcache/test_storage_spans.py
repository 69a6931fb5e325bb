"""A span's bytes in many layers at once are each layer's own (`span_bytes`), views of the
very KV tensor the engine reads."""

from __future__ import annotations

import torch

from shared.kvcache.storage import KVStorage


def test_a_span_in_many_layers_is_each_layers_span() -> None:
    storage = KVStorage(4, 6, 4, 2, 8, torch.float32, huge_pages=False)
    storage.kv.copy_(torch.randn(storage.kv.shape))
    many = storage.spans_of_layers(range(1, 4), 2, 1, 3)
    assert len(many) == 3
    for layer, (k, v) in zip(range(1, 4), many, strict=True):
        assert (k, v) == storage.span_bytes(layer, 2, 1, 3)
        want = [storage.kv[layer, h, 2, 1:4].contiguous().numpy().tobytes() for h in (0, 1)]
        assert [bytes(k), bytes(v)] == want
    k, _ = many[0]
    k[:4] = b"\0\0\0\0"  # a view, not a copy
    assert storage.kv[1, 0, 2, 1, 0, 0].item() == 0.0
