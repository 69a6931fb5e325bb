"""At DEBUG the engine says what each step computes (decode rows, prompt tokens), which with
the loop's step time shows where a load's time goes (docs/benchmarks.md's step breakdowns)."""

from __future__ import annotations

import logging

from shared.sampling_params import SamplingParams
from tests.shared.engine.test_mock_runner import mock_engine


def test_each_step_logs_its_decode_rows_and_prompt_tokens(smollm2_dir, caplog) -> None:
    engine = mock_engine(smollm2_dir)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    engine.add_request("a", list(range(40)), params)
    engine.add_request("b", list(range(100, 125)), params)
    with caplog.at_level(logging.DEBUG, logger="kvstack.engine"):
        while engine.has_unfinished:
            engine.step()
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step: ")]
    assert steps[0] == "step: 0 decode rows, 65 prompt tokens"
    assert steps[1:] == ["step: 2 decode rows, 0 prompt tokens"] * 2
