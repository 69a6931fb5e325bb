"""`python -m bench decode-attention`, run small: each point timed at every prefetch distance
asked for, the kernel's own distance put back after, and bad options fail with one line."""

from __future__ import annotations

import orjson
import pytest

from bench.cli import build_parser
from shared.errors import KvstackError
from shared.model.kernels import cpu_ops

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")


def run(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    args = build_parser().parse_args(["decode-attention", "--cache-mib", "4", *argv])
    assert args.run(args) == 0
    return orjson.loads(capsys.readouterr().out)


def test_each_point_at_each_distance(capsys) -> None:
    default = cpu_ops().set_kv_prefetch(16)
    cpu_ops().set_kv_prefetch(default)
    report = run(capsys, "--batch-sizes", "1,3", "--contexts", "40", "--prefetch", "0,auto,4",
                 "--repeats", "1", "--json")  # fmt: skip
    rows = report["rows"]
    assert [(r["dtype"], r["batch"]) for r in rows] == [
        ("float32", 1), ("float32", 3), ("bfloat16", 1), ("bfloat16", 3)
    ]  # fmt: skip
    for r in rows:
        assert set(r["us"]) == {"0", "auto", "4"} and all(t > 0 for t in r["us"].values())
        assert all(rate > 0 for rate in r["gb_s"].values())
    assert cpu_ops().set_kv_prefetch(default) == default  # the bench put it back


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--prefetch", "0,-1", "numbers out of range"),
        ("--prefetch", "0,soon", "whole numbers"),
        ("--batch-sizes", "0", "numbers out of range"),
        ("--contexts", "a", "whole numbers"),
        ("--dtypes", "float16", "not float32 or bfloat16"),
        ("--cache-mib", "0", "1 or more"),
    ],
)
def test_bad_options_fail_with_one_line(flag, value, message) -> None:
    args = build_parser().parse_args(["decode-attention", flag, value])
    with pytest.raises(KvstackError, match=message):
        args.run(args)
