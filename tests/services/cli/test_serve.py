"""`kvstack serve`'s thread counts: decode steps get --threads unless --decode-threads says
otherwise, and a count below one is a one-line error before anything loads."""

from __future__ import annotations

from services.cli.main import build_parser, main
from services.cli.serve import colocated_config, decode_threads


def parse(*argv: str):
    return build_parser().parse_args(["serve", "--insecure", *argv])


def test_decode_steps_take_every_thread_unless_told_otherwise() -> None:
    assert decode_threads(parse(), 4) == 4
    assert decode_threads(parse("--decode-threads", "1"), 4) == 1
    engine = colocated_config(parse("--decode-threads", "1"), 1, 4).engine
    assert (engine.num_threads, engine.prefill_threads) == (1, 4)


def test_fewer_than_one_decode_thread_is_a_one_line_error(capsys) -> None:
    assert main(["serve", "--insecure", "--decode-threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "--decode-threads must be at least 1, got 0" in err and "Traceback" not in err
