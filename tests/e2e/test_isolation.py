"""A poison request does not take its batch down: normal requests beside it answer as the
reference engine does, and sampling parameters out of range are refused before any work."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from shared.sampling_params import SamplingParams
from tests.e2e.conftest import API_KEY

MODEL = "SmolLM2-135M-Instruct"
MAX_TOKENS = 12
PROMPTS = [
    "What is the capital of France?",
    "Name three colours.",
    "Count to five.",
    "What is 2+2?",
    "Say hello in Spanish.",
    "What is a cat?",
    "Write one word about the sea.",
    "Who wrote Hamlet?",
]
# temperature 1e-320 divided logits into inf/NaN and failed every request on the worker
POISON = dict(temperature=1e-320)
SEEDED = dict(temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    """The session's stack (tests/e2e/conftest.py), shared with test_serving.py."""
    return openai.OpenAI(
        base_url=f"{stack.api_url}/v1", api_key=API_KEY, max_retries=0, timeout=120
    )


def ask(client: openai.OpenAI, prompt: str, **params) -> str:
    result = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        **{"temperature": 0, **params},
    )
    return result.choices[0].message.content


def reference_texts(reference, prompts: list[str], **params) -> list[str]:
    """What the reference engine answers to each prompt (one batch: seeded draws depend on
    the seed and the token's position only, so batching changes nothing)."""
    prompt_ids = [
        reference.info.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        for prompt in prompts
    ]
    sampling = SamplingParams(max_tokens=MAX_TOKENS, **{"temperature": 0, **params})
    return [c.text for c in reference.generate(prompt_ids, sampling)]


def test_a_poison_request_leaves_its_batch_unharmed(client, reference) -> None:
    calls = [(prompt, {}) for prompt in PROMPTS]
    calls += [(PROMPTS[0], POISON), (PROMPTS[1], SEEDED)]
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(lambda call: ask(client, call[0], **call[1]), calls))
    greedy = reference_texts(reference, PROMPTS)
    assert answers[: len(PROMPTS)] == greedy
    assert answers[-2] == greedy[0]  # the poison request is greedy now, and completes
    assert answers[-1] == reference_texts(reference, [PROMPTS[1]], **SEEDED)[0]


def test_temperature_out_of_openais_range_is_a_400(client) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, PROMPTS[0], temperature=3)
    assert info.value.param == "temperature"
