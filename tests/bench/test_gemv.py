"""`python -m bench gemv`, run small: every way of multiplying quantized rows is timed, each
GEMV once per prefetch distance asked for, and bad options fail with one clear line."""

from __future__ import annotations

import orjson
import pytest

from bench.cli import build_parser
from shared.errors import KvstackError
from shared.model.kernels import cpu_ops

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")


def run(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    args = build_parser().parse_args(["gemv", "--layers", "1", "--repeats", "1", *argv])
    assert args.run(args) == 0
    return orjson.loads(capsys.readouterr().out)


def test_the_quantized_formats_alone(capsys) -> None:
    report = run(capsys, "--dtypes", "", "--rows", "1", "--formats", "q4_0", "--json")
    assert report["dtypes"] == {} and report["formats"]["q4_0"]["by_rows"][0]["rows"] == 1


def test_quantized_ways_by_rows_with_two_prefetch_distances(capsys) -> None:
    report = run(capsys, "--dtypes", "float32", "--rows", "1,2", "--formats", "q4_1",
                 "--prefetch", "0,64", "--json")  # fmt: skip
    q4 = report["formats"]["q4_1"]
    assert [r["rows"] for r in q4["by_rows"]] == [1, 2]
    for row in q4["by_rows"]:
        for way in ("gemv_float@0", "gemv_float@64", "gemv_q8@0", "gemv_q8@64", "tiles_float"):
            assert row[f"{way}_us"] > 0
        assert row["fastest"] in {k.removesuffix("_us") for k in row if k.endswith("_us")}
    assert cpu_ops().set_weight_prefetch(2048) == 2048  # the bench put the default back


def test_q4_k_on_llama_1b_shapes_interleaves(capsys) -> None:
    """Q4_K (random blocks: the gguf package cannot quantize into it) on shapes whose rows
    hold whole super-blocks, its integer GEMVs timed on GGUF's rows and on interleaved ones."""
    report = run(capsys, "--dtypes", "", "--rows", "1", "--formats", "q4_k", "--shapes",
                 "llama-1b", "--json")  # fmt: skip
    assert report["shapes"] == "llama-1b"
    (row,) = report["formats"]["q4_k"]["by_rows"]
    assert row["gemv_q16_us"] > 0 and row["gemv_q16_x8_us"] > 0
    assert row["gemv_q8_us"] > 0 and row["gemv_q8_x8_us"] > 0
    # an AVX-512 build's one group of 8 rows a vector, beside (AVX2 builds have only that)
    assert ("gemv_q16_x8/256_us" in row) == (report["isa"] == "avx512")
    assert row.get("gemv_q16_x8/256_us", 1) > 0
    assert cpu_ops().set_gemv_x16(True) is True  # the bench put it back


def test_the_table_names_each_format(capsys) -> None:
    args = build_parser().parse_args(
        ["gemv", "--layers", "1", "--repeats", "1", "--dtypes", "float32", "--rows", "1",
         "--formats", "q8_0"]
    )  # fmt: skip
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert "q8_0: float32 GEMV beats float32 tiles up to" in out and "gemv_q8" in out


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--formats", "q5_k", "no format 'q5_k'"), ("--prefetch", "1k", "give byte counts"),
     ("--prefetch", "-64", "0 or more bytes"),
     ("--formats", "q4_k", "multiple of 256 values; smollm2-135m's are 576, 1536")],
)  # fmt: skip
def test_bad_options_fail_clearly(option, value, message) -> None:
    args = build_parser().parse_args(["gemv", "--dtypes", "float32", "--rows", "1", option, value])
    with pytest.raises(KvstackError, match=message):
        args.run(args)
