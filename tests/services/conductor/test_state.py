from services.conductor.state import ClusterState
from shared.messages import Heartbeat


def beat(worker_id: str, service: str, time: float, free: int = 100, queued: int = 0,
         draining: bool = False) -> Heartbeat:
    return Heartbeat(service, worker_id, time, 1.0, block_size=16, free_blocks=free,
                     total_blocks=100, queued_tokens=queued, draining=draining)


def test_a_worker_that_misses_three_beats_is_dead_and_forgotten() -> None:
    state = ClusterState()
    state.observe(beat("p0", "prefill", time=10.0))
    assert [hb.worker_id for hb in state.live("prefill", now=12.9)] == ["p0"]
    assert state.live("prefill", now=13.1) == []
    assert state.forget_dead(now=13.1) == ["p0"]
    assert state.snapshot(now=13.1).prefill == ()


def test_draining_workers_get_no_new_work() -> None:
    state = ClusterState()
    state.observe(beat("d0", "decode", time=0.0, draining=True))
    assert state.snapshot(now=0.5).decode == ()


def test_assigned_work_counts_until_the_next_heartbeat() -> None:
    state = ClusterState()
    state.observe(beat("p0", "prefill", time=0.0, queued=10))
    state.observe(beat("d0", "decode", time=0.0, free=100))
    state.assign("p0", 300)
    state.assign("d0", 33)            # three blocks of 16
    snap = state.snapshot(now=0.5)
    assert snap.prefill[0].queued_tokens == 310 and snap.prefill[0].num_waiting == 1
    assert snap.decode[0].free_blocks == 97
    state.observe(beat("p0", "prefill", time=1.0, queued=0))
    assert state.snapshot(now=1.1).prefill[0].queued_tokens == 0
