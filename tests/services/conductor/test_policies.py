from services.conductor.policies import load_balance
from services.conductor.snapshot import ClusterSnapshot, WorkerLoad
from shared.messages import PlacementRequest


def worker(worker_id: str, service: str, queued: int = 0, free: int = 100, total: int = 100,
           running: int = 0) -> WorkerLoad:
    return WorkerLoad(worker_id, service, running, 0, queued, free, total, 16)


def request(num_tokens: int = 100, exclude: tuple[str, ...] = ()) -> PlacementRequest:
    return PlacementRequest("r", num_tokens, 16, 0.0, exclude=exclude)


def snapshot(prefill, decode) -> ClusterSnapshot:
    return ClusterSnapshot(0.0, tuple(prefill), tuple(decode))


def test_least_queued_prefill_and_emptiest_decode_win() -> None:
    snap = snapshot([worker("p0", "prefill", queued=500), worker("p1", "prefill", queued=20)],
                    [worker("d0", "decode", free=10), worker("d1", "decode", free=90)])
    placement = load_balance(snap, request())
    assert placement.accepted and (placement.prefill_id, placement.decode_id) == ("p1", "d1")


def test_no_worker_of_a_kind_is_a_rejection_with_retry_after() -> None:
    placement = load_balance(snapshot([], [worker("d0", "decode")]), request())
    assert not placement.accepted and "prefill" in placement.reason
    assert placement.retry_after > 0


def test_excluded_workers_are_skipped() -> None:
    snap = snapshot([worker("p0", "prefill"), worker("p1", "prefill", queued=999)],
                    [worker("d0", "decode")])
    assert load_balance(snap, request(exclude=("p0",))).prefill_id == "p1"


def test_a_prompt_larger_than_any_decode_pool_is_rejected() -> None:
    snap = snapshot([worker("p0", "prefill")], [worker("d0", "decode", total=4)])
    placement = load_balance(snap, request(num_tokens=16 * 4))
    assert not placement.accepted and "decode" in placement.reason
