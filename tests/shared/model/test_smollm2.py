"""SmolLM2-135M-Instruct: our greedy output equals the reference implementation's."""

from __future__ import annotations

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.sampling_params import SamplingParams

QUESTIONS = [  # each answer runs past 32 tokens, so all 32 are compared
    "Write a haiku about the sea.",
    "Tell me about the history of Paris.",
    "List three uses of copper.",
]
NUM_TOKENS = 32


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    # NOTE: parity is float32 against float32: the GGUF dequantized, as transformers reads it.
    config = EngineConfig(
        model="SmolLM2-135M-Instruct", dtype="float32", weights="float", kv_cache_bytes=256 << 20
    )
    return LLMEngine(config)


def chat(engine: LLMEngine, question: str) -> list[int]:
    return engine.info.tokenizer.encode_chat([{"role": "user", "content": question}])


def test_greedy_chat_equals_transformers_token_for_token(engine, hf_smollm2) -> None:
    reference, _ = hf_smollm2
    prompts = [chat(engine, q) for q in QUESTIONS]
    ours = engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS, temperature=0))
    for prompt, result in zip(prompts, ours):
        ids = torch.tensor([prompt])
        expected = reference.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NUM_TOKENS,
            do_sample=False,
            pad_token_id=2,
        )[0, len(prompt) :]
        assert len(result.token_ids) == NUM_TOKENS
        assert result.token_ids == expected.tolist()


def test_answers_sensibly_and_stops_at_end_of_turn(engine) -> None:
    params = SamplingParams(max_tokens=48, temperature=0)
    (result,) = engine.generate([chat(engine, "What is the capital of France?")], params)
    assert "Paris" in result.text
    assert result.finish_reason == "stop" and result.token_ids[-1] == 2


def test_stop_string_cuts_the_text(engine) -> None:
    params = SamplingParams(max_tokens=48, temperature=0, stop=("France",))
    (result,) = engine.generate([chat(engine, "What is the capital of France?")], params)
    assert result.text == "The capital of " and result.finish_reason == "stop"
