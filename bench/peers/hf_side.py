"""transformers in this process: the reference implementation, single stream only (it has no
server to put under load). Timed as the servers are: prefill by the first token's time,
decode by the gaps between the tokens `generate` hands its streamer."""

from __future__ import annotations

import time
from pathlib import Path

import torch

TRANSFORMERS = "transformers"


class TokenTimes:
    """A `generate` streamer that keeps when each new token came (the first `put` is the
    prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


class TransformersSide:
    def __init__(self, hf_dir: Path, dtype: str, threads: int) -> None:
        import transformers

        torch.set_num_threads(threads)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=getattr(torch, dtype)
        ).eval()

    def prefill_rate(self, text: str) -> float:
        ids = self.tokenizer(text, return_tensors="pt").input_ids
        start = time.perf_counter()
        times = self._generate(ids, 1)
        return ids.shape[1] / (times[0] - start)

    def decode_rate(self, text: str, num_tokens: int) -> float:
        ids = self.tokenizer(text, return_tensors="pt").input_ids
        times = self._generate(ids, num_tokens)
        return (len(times) - 1) / (times[-1] - times[0])

    @torch.inference_mode()
    def _generate(self, ids: torch.Tensor, num_tokens: int) -> list[float]:
        streamer = TokenTimes()
        self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            pad_token_id=0,
            streamer=streamer,
        )
        return streamer.times
