"""The chaos report's verdict on KV blocks: what counts as leaked and who was silent."""

from bench.chaos.runner import ChaosReport


def test_a_worker_holding_more_blocks_after_the_load_has_leaked() -> None:
    report = ChaosReport([], {"decode-0": 2, "decode-1": 0}, {"decode-0": 2, "decode-1": 3})
    assert report.leaked == {"decode-1": 3}
    assert not report.ok


def test_a_worker_silent_after_the_load_is_named_not_counted_as_leaked() -> None:
    report = ChaosReport([], {"decode-0": 0}, {"decode-0": -1})
    assert report.leaked == {}
    assert report.silent == ["decode-0"]
    assert not report.ok


def test_a_worker_without_a_baseline_is_not_called_leaked() -> None:
    report = ChaosReport([], {"decode-0": -1}, {"decode-0": 0, "decode-1": 0})
    assert report.leaked == {}
    assert report.ok
