"""`python -m bench offload` against real attention-worker processes on a secure stack."""

from __future__ import annotations

import json

from bench.cli import build_parser


def test_offload_bench_measures_every_group_and_the_bytes_match_the_formula(
    tiny_llama_dir, capsys
) -> None:
    args = build_parser().parse_args(
        [
            "offload",
            "--model",
            str(tiny_llama_dir),
            "--groups",
            "2",
            "--micro-batches",
            "2",
            "--batch-sizes",
            "2",
            "--prompt-len",
            "8",
            "--decode-tokens",
            "2",
            "--repeats",
            "1",
            "--json",
        ]
    )
    assert args.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "cpu"
    offloaded = [row for row in report["rows"] if row["mode"] == "offload"]
    assert [(r["attention_workers"], r["micro_batches"]) for r in offloaded] == [(2, 2)]
    assert offloaded[0]["tok_s"] > 0
    assert offloaded[0]["sent_per_token_layer"] == report["formula_bytes"]["send"]
    assert offloaded[0]["received_per_token_layer"] == report["formula_bytes"]["receive"]
