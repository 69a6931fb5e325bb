"""`python -m bench quant`'s tables: a run of quantized weights alone (no float row to be
"vs") prints a dash there instead of failing after minutes of timing."""

from __future__ import annotations

from bench.quant import tables


def speed(isa: str, weights: str, tok_s: float) -> dict:
    return {"isa": isa, "weights": weights, "weight_mb": 100.0, "decode_tok_s": tok_s,
            "read_gb_s": 30.0, "share_of_limit": 0.5}  # fmt: skip


def report(*rows: dict) -> dict:
    accuracy = [{"weights": "auto", "perplexity": 9.0, "agreement": 1.0, "tokens": 512}]
    return {"accuracy": accuracy, "speed": list(rows), "cpu_flags": "avx2"}


def test_rows_are_against_their_builds_float32():
    text = tables(report(speed("avx2", "float", 50.0), speed("avx2", "auto", 150.0),
                         speed("llama.cpp", "the file", 100.0)))  # fmt: skip
    assert "| avx2 | auto | 100 | 150.0 | 3.00x |" in text
    assert "| llama.cpp | the file | 100 | 100.0 | 2.00x |" in text


def test_without_a_float_row_the_ratio_is_a_dash():
    text = tables(report(speed("avx512", "auto", 150.0), speed("llama.cpp", "the file", 99.0)))
    assert "| avx512 | auto | 100 | 150.0 | - |" in text
    assert "| llama.cpp | the file | 100 | 99.0 | - |" in text
