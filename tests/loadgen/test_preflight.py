"""Before a run: base URLs, the model list, the key, and the model's name."""

from __future__ import annotations

import aiohttp
import pytest

from loadgen.client import Target
from loadgen.preflight import model_names, normalize_base_url, resolve_model, served_models
from shared.errors import KvstackError
from tests.e2e.conftest import free_port
from tests.loadgen.conftest import API_KEY, MODEL


@pytest.mark.parametrize(
    "url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"]
)
def test_base_urls_lose_a_trailing_v1(url) -> None:
    assert normalize_base_url(url) == "http://h:8000"


def test_a_base_url_needs_a_scheme() -> None:
    with pytest.raises(KvstackError, match="http://"):
        normalize_base_url("127.0.0.1:8000")


def test_model_names_list_ids_then_roots() -> None:
    body = b'{"data": [{"id": "a", "root": "/models/a"}, {"id": "b"}]}'
    assert model_names(body, "u") == ["a", "b", "/models/a"]
    with pytest.raises(KvstackError, match="model list"):
        model_names(b'{"object": "error"}', "u")


async def test_the_first_listed_model_is_taken_when_none_is_given(fake_server) -> None:
    async with aiohttp.ClientSession() as session:
        listed = await served_models(session, fake_server.url, API_KEY)
        target = Target(fake_server.url, "", api_key=API_KEY)
        assert listed == [MODEL] and await resolve_model(session, target, listed) == MODEL


async def test_an_unlisted_model_is_tried_once_and_a_404_stops_the_run(fake_server) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(KvstackError, match=r"does not serve model 'other'.*lists: fake-model"):
            await resolve_model(session, Target(fake_server.url, "other", api_key=API_KEY), [MODEL])


async def test_a_wrong_key_says_so(fake_server) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(KvstackError, match=r"refused the API key.*--api-key"):
            await served_models(session, fake_server.url, "wrong")


async def test_an_unreachable_server_names_its_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with aiohttp.ClientSession() as session:
        with pytest.raises(KvstackError, match=f"cannot reach the server at {url}"):
            await served_models(session, url, None)
