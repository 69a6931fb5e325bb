import pytest

from loadgen.sim.decode import Batch, DecodeNode
from loadgen.sim.job import Job
from shared.decode.commit import over_tbt_slo
from tests.loadgen.sim.builders import COST, row


def job(index: int, tokens: int, output: int) -> Job:
    return Job(index, f"r{index}", row(0.0, tokens, output, 10 * index), 0.0)


def test_each_step_gives_every_running_request_a_token():
    node = DecodeNode("d", COST, 100_000)
    a, b = job(0, 1000, 3), job(1, 500, 4)
    node.arrive(a, 0.0)
    node.advance(0.005)  # mid-step: b joins at the next one
    node.arrive(b, 0.005)
    node.advance(10.0)
    s1 = COST.decode_step_time(1, 1001)
    s2 = s1 + COST.decode_step_time(2, 1002 + 501)
    s3 = s2 + COST.decode_step_time(1, 501 + 1)  # a is done after two steps
    s4 = s3 + COST.decode_step_time(1, 502 + 1)
    assert a.token_ends == pytest.approx([s1, s2])
    assert b.token_ends == pytest.approx([s2, s3, s4])
    assert node.done == [a, b] and node.step_end is None and node.batch.context == 0


def test_requests_wait_for_room_in_the_kv_pool():
    node = DecodeNode("d", COST, 1500)
    a, b = job(0, 1000, 3), job(1, 1000, 3)
    node.arrive(a, 0.0)
    node.arrive(b, 0.0)
    assert node.batch.size == 1 and list(node.waiting) == [b]
    node.advance(10.0)
    assert b.join_step == 2 and b.token_ends[0] > a.token_ends[-1]


def test_a_request_larger_than_the_pool_runs_alone():
    batch = Batch(COST, 100)
    big = job(0, 1000, 2)
    assert batch.fits(big)
    batch.reserve(big)
    assert not batch.fits(job(1, 10, 2))


def test_the_baseline_check_uses_the_mean_step_time_while_busy():
    node = DecodeNode("d", COST, 100_000)
    assert node.tbt == 0.0  # idle
    node.arrive(job(0, 1000, 50), 0.0)
    node.advance(0.2)
    assert node.tbt == pytest.approx(node.mean_step_seconds) and node.tbt > 0.001
    assert "prefill wasted" in over_tbt_slo(node.tbt, 0.001)


def test_heartbeat_reports_the_batch():
    node = DecodeNode("d", COST, 512 * 100)
    node.arrive(job(0, 1000, 20), 0.0)
    hb = node.heartbeat(0.0, 1.0, 512)
    assert (hb.num_running, hb.context_tokens, hb.total_blocks) == (1, 1001, 100)
    assert hb.free_blocks == (512 * 100 - 1020) // 512
