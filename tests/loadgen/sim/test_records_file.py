"""The columnar records file of `loadgen sim --records`: what goes in comes back."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.records import RequestRecord
from loadgen.sim.records_file import load_records, request_gaps, save_records
from loadgen.sim.report import mooncake_tbt, record_of
from shared.errors import KvstackError
from tests.loadgen.sim.builders import config, conversations, simulate

DONE = RequestRecord(
    0,
    1.5,
    1000,
    3,
    0.25,
    (0.01, 0.03),
    0.29,
    cached_tokens=512,
    extra={
        "prefill": "prefill-01",
        "decode": "decode-00",
        "total_blocks": 2,
        "predicted_ttft": 0.2,
        "local_blocks": 0,
        "fetched_blocks": 1,
        "fetched_from": "kvstore",
        "prefill_queue_s": 0.05,
        "fetch_s": 0.01,
        "compute_s": 0.19,
    },
)
REJECTED = RequestRecord(1, 2.0, 700, 0, None, (), 0.0, 503, "overloaded")


def test_the_columns_round_trip(tmp_path):
    path = save_records(tmp_path / "r.npz", [DONE, REJECTED], with_itl=True)
    c = load_records(path)
    assert c["arrival"].tolist() == [1.5, 2.0] and c["status"].tolist() == [200, 503]
    assert c["ttft"][0] == 0.25 and math.isnan(c["ttft"][1])
    assert c["e2e"][0] == 0.29 and math.isnan(c["e2e"][1])
    assert c["prompt_tokens"].tolist() == [1000, 700] and c["cached_tokens"].tolist() == [512, 0]
    names = c["node_names"].tolist()
    assert names == ["decode-00", "kvstore", "prefill-01"]
    assert (c["prefill"].tolist(), c["decode"].tolist()) == ([2, -1], [0, -1])
    assert c["fetched_from"].tolist() == [1, -1]
    assert c["queue_s"][0] == 0.05 and c["predicted_ttft"][0] == 0.2
    assert math.isnan(c["predicted_ttft"][1]) and c["fetched_blocks"].tolist() == [1, 0]
    assert c["mooncake_tbt"][0] == pytest.approx(0.03)
    assert request_gaps(c, 0) == pytest.approx([0.01, 0.03]) and request_gaps(c, 1).size == 0


def test_a_simulation_s_records_match_its_columns(tmp_path):
    records = [record_of(j) for j in simulate(conversations(30), config(2, 2)).jobs]
    c = load_records(save_records(tmp_path / "sim.records", records, with_itl=True))
    assert len(c["arrival"]) == 30 and c["itl_offsets"][-1] == sum(len(r.itl) for r in records)
    for i, r in enumerate(records):
        assert c["ttft"][i] == r.ttft and c["output_tokens"][i] == r.output_len
        assert c["node_names"][c["prefill"][i]] == r.extra["prefill"]
        assert np.allclose(request_gaps(c, i), r.itl, rtol=1e-6)
        assert c["mooncake_tbt"][i] == pytest.approx(mooncake_tbt(r.itl))


def test_without_gaps_the_file_says_so(tmp_path):
    c = load_records(save_records(tmp_path / "r.npz", [DONE], with_itl=False))
    with pytest.raises(KvstackError, match="--records-itl"):
        request_gaps(c, 0)
    with pytest.raises(KvstackError, match="not found"):
        load_records(tmp_path / "none.npz")
