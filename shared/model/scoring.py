"""Score a whole text in one causal forward pass (no KV cache): for accuracy checks of one
model against another (greedy agreement, perplexity)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from shared.model.llama import ForwardBatch, LlamaModel

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@torch.inference_mode()
def causal_logits(
    model: LlamaModel, token_ids: list[int], attention: Attend | None = None
) -> torch.Tensor:
    """float32 logits [T, vocab] of each position's next token; the prompt attends through
    `attention` (q [T, H, D], k and v [T, H_kv, D] -> [T, H, D]; default torch's causal
    softmax in q's dtype)."""
    ids = torch.tensor(token_ids)
    attend = attention or _causal_attention
    batch = ForwardBatch(
        positions=torch.arange(len(token_ids)),
        attention=lambda _layer, q, k, v: attend(q, k, v),
    )
    return model.compute_logits(model(ids, batch))


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # q [T, H, D], k and v [T, H_kv, D] -> [T, H, D]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return out.transpose(0, 1)


def perplexity(logits: torch.Tensor, token_ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of tokens 1.. given their prefixes."""
    targets = torch.tensor(token_ids[1:])
    return torch.exp(F.cross_entropy(logits[:-1].float(), targets)).item()


def greedy_agreement(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """The share of positions whose most likely next token is the reference's."""
    return (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
