"""The container suite: compose.yaml's stack on a real Docker engine, from the images
`make image` built (`make compose-test` builds them first, then runs this with
--run-compose). Where Docker cannot run, every test here skips with the reason."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import openai
import pytest

from bench.chaos.load import Case
from bench.compose.cli import IMAGES, TOPICS_AND_A_LONG_ONE
from bench.compose.docker import image_exists, unavailable
from bench.compose.network import clear
from bench.compose.stack import ComposeStack

MAX_TOKENS = 48
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def docker() -> None:
    """Skips the suite, saying why, where containers cannot run here."""
    why = unavailable()
    if why:
        pytest.skip(f"no containers here: {why}")
    missing = [image for image in IMAGES if not image_exists(image)]
    if missing:
        pytest.skip(f"no image {', '.join(missing)}: make compose-test builds them")


NETWORK_TOOLS = ("iptables", "tc", "nsenter")


@pytest.fixture(scope="session")
def root() -> None:
    """Faults on the network need root and these tools here."""
    if os.geteuid() != 0:
        pytest.skip(f"network faults need root on this host ({', '.join(NETWORK_TOOLS)})")
    missing = [tool for tool in NETWORK_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"network faults need {', '.join(missing)} (iptables, iproute2, util-linux)")


@pytest.fixture(scope="session")
def cases(smollm2_dir) -> list[Case]:
    """The steady load's prompts with the reference engine's answers (float32)."""
    from bench.chaos.cli import reference_cases

    return reference_cases("SmolLM2-135M-Instruct", MAX_TOKENS, TOPICS_AND_A_LONG_ONE)


def started(tmp_path_factory, name: str, **options) -> Iterator[ComposeStack]:
    """A compose project up until the module ends, then down to nothing; each container's
    log is kept beside its secrets (workdir/logs)."""
    stack = ComposeStack.prepare(tmp_path_factory.mktemp(name), **options)
    try:
        stack.up()
        yield stack
    finally:
        stack.save_logs()
        clear(stack.project)
        stack.down()
        assert stack.leftovers() == [], "compose down -v left something behind"


def client(stack: ComposeStack, key: str | None = None) -> openai.OpenAI:
    """The official client on the stack's published port, with its key unless `key`."""
    key = stack.api_key if key is None else key
    return openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=key, max_retries=0, timeout=120)


def greedy_text(api: openai.OpenAI, case: Case) -> str:
    """The stack's greedy answer to a case's prompt, as long as the reference's."""
    completion = api.completions.create(
        model=MODEL,
        prompt=list(case.prompt),
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    return completion.choices[0].text
