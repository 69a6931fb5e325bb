"""Through the OpenAI API, the disaggregated stack answers as `kvstack generate` does."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import openai
import pytest

from shared.sampling_params import SamplingParams
from tests.e2e.conftest import API_KEY

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.api_url}/v1", api_key=API_KEY, max_retries=0, timeout=120
    )


def expected(reference, prompt_ids: list[int], max_tokens: int, **params):
    params = SamplingParams(max_tokens=max_tokens, temperature=0, **params)
    return reference.generate([prompt_ids], params)[0]


def streamed_completion(client, **kwargs) -> tuple[str, dict, str]:
    text, usage, finish = "", None, None
    stream = client.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    )
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    return text, usage, finish


@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_generate(client, reference, stream) -> None:
    prompt = "The capital of France is"
    want = expected(reference, reference.info.tokenizer.encode(prompt), 24)
    kwargs = dict(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=24, temperature=0)
    if stream:
        text, usage, finish = streamed_completion(client, **kwargs)
    else:
        result = client.completions.create(**kwargs)
        text, usage, finish = result.choices[0].text, result.usage, result.choices[0].finish_reason
    assert text == want.text
    assert usage.completion_tokens == len(want.token_ids)
    assert usage.prompt_tokens == len(want.prompt_token_ids)
    assert finish == want.finish_reason


def test_token_id_prompt_with_ignore_eos_runs_to_max_tokens(client, reference) -> None:
    prompt_ids = reference.info.tokenizer.encode_chat([{"role": "user", "content": QUESTION}])
    want = expected(reference, prompt_ids, 40, ignore_eos=True)
    text, usage, finish = streamed_completion(
        client,
        model="SmolLM2-135M-Instruct",
        prompt=prompt_ids,
        max_tokens=40,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert usage.completion_tokens == 40 and finish == "length"
    assert text == want.text


@pytest.mark.parametrize("stream", [False, True])
def test_chat_equals_generate(client, reference, stream) -> None:
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    want = expected(reference, reference.info.tokenizer.encode_chat(messages), 48)
    kwargs = dict(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=48, temperature=0)
    if not stream:
        result = client.chat.completions.create(**kwargs)
        assert result.choices[0].message.role == "assistant"
        assert result.choices[0].message.content == want.text
        return
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"  # role rides on the first token
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text


def test_answers_a_simple_question_sensibly(client) -> None:
    result = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=30,
        temperature=0,
    )
    assert "Paris" in result.choices[0].message.content
    assert result.choices[0].finish_reason == "stop"


def test_sixteen_concurrent_streams_each_equal_their_single_output(client, reference) -> None:
    topics = [
        "the sea",
        "a cat",
        "winter",
        "bread",
        "a river",
        "the moon",
        "music",
        "trees",
        "rain",
        "a city",
        "stars",
        "coffee",
        "mountains",
        "a train",
        "friendship",
        "fire",
    ]
    prompts = [f"Write one sentence about {topic}." for topic in topics]
    wants = [
        expected(
            reference, reference.info.tokenizer.encode_chat([{"role": "user", "content": p}]), 24
        ).text
        for p in prompts
    ]

    def stream(prompt: str) -> str:
        chunks = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=24,
            temperature=0,
            stream=True,
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(stream, prompts))
    assert got == wants


def test_logprobs_match_the_engine(client, reference) -> None:
    prompt = "The capital of France is"
    want = expected(reference, reference.info.tokenizer.encode(prompt), 6, logprobs=2)
    result = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=6, temperature=0, logprobs=2
    )
    logprobs = result.choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(want.token_ids)
    for got, wanted in zip(logprobs.token_logprobs, want.logprobs):
        assert got == pytest.approx(wanted.logprob, abs=1e-3)
    assert all(len(top) == 2 for top in logprobs.top_logprobs)


def test_models_lists_the_served_model_with_root(client) -> None:
    model = client.models.list().data[0]
    assert model.id == "SmolLM2-135M-Instruct" and model.root


def test_the_control_plane_serves_without_torch(stack, client) -> None:
    """The conductor and the gateway never hold a tensor: they start without torch (a
    second or more of CPU and some 200 MB each, at every start and restart)."""
    client.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=2)
    for name in ("conductor-0", "gateway-0", "prefill-0"):
        maps = Path(f"/proc/{stack.process(name).popen.pid}/maps").read_text()
        assert ("libtorch" in maps) == name.startswith("prefill"), name
