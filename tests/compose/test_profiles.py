"""compose.yaml's profiles start too: `offload` (an attention worker and a decode worker
whose attention runs there) and `nats-cluster` (NATS as three routed nodes, the services
given every node's URL); one node cut off from the others under load loses nothing."""

from __future__ import annotations

import pytest

from bench.compose.docker import run
from bench.compose.faults import Fault
from bench.compose.runner import ComposeChaosConfig, run_compose_chaos
from tests.compose.conftest import MAX_TOKENS, client, greedy_text, started

PROFILE_SERVICES = {"attention-worker", "decode-offload", "nats-1", "nats-2", "nats-3"}


@pytest.fixture(scope="module")
def stack(docker, tmp_path_factory):
    yield from started(tmp_path_factory, "compose-profiles", profiles=("offload", "nats-cluster"))


def test_the_offload_and_nats_cluster_profiles_start_and_are_healthy(stack) -> None:
    containers = stack.containers()
    assert {c.service for c in containers} >= PROFILE_SERVICES
    assert all(c.health == "healthy" for c in containers if c.service != "prometheus")


def test_a_decode_worker_whose_attention_runs_on_an_attention_worker_serves(stack, cases) -> None:
    """With the plain decode worker stopped, every request decodes on decode-offload."""
    [plain] = stack.containers("decode")
    run(["docker", "stop", "-t", "30", plain.id], timeout=120)
    try:
        api = client(stack)
        for case in cases[:2]:
            assert greedy_text(api, case) == case.want
    finally:
        run(["docker", "start", plain.id])
        stack.wait_ready()


def test_a_nats_node_cut_off_under_load_loses_nothing(stack, cases, root) -> None:
    """The node with the most clients cut off for 20 s: nothing lost or hung; the requests
    in flight at the cut, and ones begun during it, may end with a clear error (a decode
    worker whose attention worker was on that node re-forms its group and turns requests
    away meanwhile, so a request may use up its attempts or its migrations; tokens a worker
    published into the cut node are lost, and its stream waits for the gateway's no-token
    timeout before it moves); every request begun after the cut is served."""
    config = ComposeChaosConfig(
        (Fault.parse("partition:nats-node"),), concurrency=3, max_tokens=MAX_TOKENS,
        phase_seconds=20, settle_seconds=5,
    )  # fmt: skip
    report = run_compose_chaos(stack, cases, config, print)
    for phase in report.phases:
        assert phase.row.lost == 0 and phase.row.hung == 0, phase
    warmup, cut, after = report.phases
    assert cut.in_flight >= 1 and cut.row.back_s is not None, cut
    assert warmup.row.errored == 0, report.errors
    # NOTE: a request counts in the phase it ends in: one begun during the cut may end after
    assert cut.errored_after_heal == 0, report.errors
    assert all(_clear(e) for e in report.errors), report.errors
    assert after.row.completed > 0, report.errors


def _clear(error: str) -> bool:
    """A stream's error event or an HTTP 503 that says why (never a broken connection)."""
    return error.startswith(("error event:", "HTTP 503: "))
