"""Logits adjusted before sampling: a grammar's mask, min_tokens, logit_bias and the
three penalties.

vLLM v1's order and definitions: the min_tokens mask and the biases first, then the
penalties (repetition over prompt and output, frequency and presence over the output),
then the sampler's temperature, min-p, top-k and top-p. Greedy requests are adjusted too
(a penalty changes the argmax). Logprobs stay those of the model's own logits, as vLLM
reports them by default.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from shared.sampling_params import SamplingParams
from shared.structured.logits import mask_logits_
from shared.structured.matcher import GrammarMatcher


@dataclass(frozen=True)
class History:
    """What a row's penalties look at: its tokens so far, the last `num_output` of which
    are output (this attempt's and, after a migration, the earlier attempts')."""

    token_ids: Sequence[int]
    num_output: int
    num_new_output: int  # this attempt's output only: what min_tokens counts
    grammar: GrammarMatcher | None = None  # where the row's output is in its grammar

    @property
    def output_ids(self) -> Sequence[int]:
        return self.token_ids[len(self.token_ids) - self.num_output :]


def adjusted(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[History | None],
    stop_ids: Collection[int],
) -> torch.Tensor:
    """logits [B, vocab] with every row whose params ask for it adjusted (a copy; the
    input is left as it was). `stop_ids`: the model's EOS tokens, masked by min_tokens."""
    rows = [i for i, p in enumerate(params) if p.adjusts_logits]
    if not rows:
        return logits
    out = logits.clone()
    for i in rows:
        history = histories[i]
        assert history is not None, "a row with adjusted logits needs its history"
        adjust_row(out[i], params[i], history, stop_ids)
    return out


def adjust_row(
    row: torch.Tensor, params: SamplingParams, history: History, stop_ids: Collection[int]
) -> None:
    """One row [vocab], in place."""
    if history.grammar is not None:
        mask_logits_(row, history.grammar)
    if history.num_new_output < params.min_tokens:
        _mask(row, _stops(params, stop_ids))
    for token_id, bias in params.logit_bias:
        if token_id < row.numel():
            row[token_id] += bias
    if params.repetition_penalty != 1.0:
        _repetition(row, history.token_ids, params.repetition_penalty)
    if params.frequency_penalty or params.presence_penalty:
        _frequency_presence(row, history.output_ids, params)


def _stops(params: SamplingParams, eos_ids: Collection[int]) -> list[int]:
    eos = () if params.ignore_eos else tuple(eos_ids)
    return [*eos, *params.stop_token_ids]


def _mask(row: torch.Tensor, token_ids: Sequence[int]) -> None:
    inside = [t for t in token_ids if t < row.numel()]
    if inside:
        row[torch.tensor(inside, dtype=torch.long, device=row.device)] = float("-inf")


def _repetition(row: torch.Tensor, token_ids: Sequence[int], penalty: float) -> None:
    """Every token seen in prompt or output: a positive logit divided by the penalty, a
    negative one multiplied (so it always moves down for penalty > 1)."""
    if not token_ids:
        return
    seen = torch.tensor(token_ids, dtype=torch.long, device=row.device).unique()
    seen = seen[seen < row.numel()]
    values = row[seen]
    row[seen] = torch.where(values > 0, values / penalty, values * penalty)


def _frequency_presence(
    row: torch.Tensor, output_ids: Sequence[int], params: SamplingParams
) -> None:
    if not output_ids:
        return
    ids = torch.tensor(output_ids, dtype=torch.long, device=row.device)
    counts = torch.bincount(ids[ids < row.numel()], minlength=row.numel()).to(row.dtype)
    row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(row.dtype)
