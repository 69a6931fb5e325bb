"""One forward pass whose failure ends only the requests that cause it.

When a step of several chunks raises, each chunk runs again alone: a chunk's KV writes
are idempotent and nothing has advanced yet, so re-running is safe. A chunk that fails
alone is that request's fault; the rest go on with their logits. Only when every chunk
fails alone is the engine itself broken.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from shared.engine.mock_runner import MockRunner
from shared.engine.runner import ModelRunner, SeqChunk

log = logging.getLogger("kvstack.engine")

LayerHook = Callable[[int, "list[SeqChunk]"], None]
StepHook = Callable[["list[SeqChunk]"], None]
Runner = ModelRunner | MockRunner

# Failures of the engine's peers (an attention worker gone), not of a request: running
# each chunk alone would only wait on the same peer again, once per chunk.
PEER_ERRORS = (ConnectionError, TimeoutError)


def execute_isolated(
    runner: Runner,
    chunks: list[SeqChunk],
    layer_hook: LayerHook | None,
    layer_gate: LayerHook | None,
) -> Sequence[torch.Tensor | Exception]:
    """Logits [num_logits, vocab] per chunk, in order, or the exception of a chunk that
    failed alone. Raises the step's exception when it is not a request's to take: one
    chunk, a peer failure, or every chunk failing alone."""
    try:
        return _execute(runner, chunks, layer_hook, layer_gate)
    except PEER_ERRORS:
        raise
    except Exception:
        if len(chunks) == 1:
            raise
        log.exception("a step of %d chunks failed; running each alone", len(chunks))
        results = [_execute_alone(runner, chunk, layer_hook, layer_gate) for chunk in chunks]
        if all(isinstance(result, Exception) for result in results):
            raise
        return results


def _execute_alone(
    runner: Runner, chunk: SeqChunk, layer_hook: LayerHook | None, layer_gate: LayerHook | None
) -> torch.Tensor | Exception:
    try:
        return _execute(runner, [chunk], layer_hook, layer_gate)[0]
    except PEER_ERRORS:
        raise
    except Exception as e:  # this request's failure, handed back in its place
        log.warning("request %s failed alone: %s: %s", chunk.request_id, type(e).__name__, e)
        return e


def _execute(
    runner: Runner,
    chunks: list[SeqChunk],
    layer_hook: LayerHook | None,
    layer_gate: LayerHook | None,
) -> list[torch.Tensor]:
    bind = lambda hook: None if hook is None else (lambda layer: hook(layer, chunks))
    return runner.execute(chunks, on_layer_done=bind(layer_hook), before_layer=bind(layer_gate))
