"""When a request's worker counts as lost: silent, gone, or restarted under its id."""

from __future__ import annotations

import time
from dataclasses import replace

from services.gateway.liveness import Liveness
from shared.messages import Heartbeat


def beat(
    worker_id: str, instance: str = "a", interval: float = 0.05, stopped: bool = False
) -> Heartbeat:
    return Heartbeat("decode", worker_id, time.time(), interval, instance=instance, stopped=stopped)


def test_a_silent_worker_is_lost_after_three_intervals() -> None:
    live = Liveness()
    live.observe(beat("d0"))
    watched = live.watch(("d0", "unknown"))
    assert live.lost(watched) is None
    time.sleep(0.2)
    live.observe(beat("p0"))  # others are heard: the silence is d0's
    assert live.lost(watched) == ("d0", "worker d0 stopped responding")


def test_when_nobody_is_heard_the_silence_is_the_gateways_own() -> None:
    live = Liveness()
    live.observe(beat("d0"))
    live.observe(beat("p0"))
    watched = live.watch(("d0",))
    time.sleep(0.2)  # cut off from NATS, or frozen: every worker went quiet at once
    assert live.isolated(time.monotonic())
    assert live.lost(watched) is None
    live.observe(beat("p0"))  # heard again, d0 still silent: now it is d0's
    assert not live.isolated(time.monotonic())
    assert live.lost(watched) == ("d0", "worker d0 stopped responding")


def test_a_restart_under_the_same_id_is_a_lost_worker() -> None:
    live = Liveness()
    live.observe(beat("d0", instance="a"))
    watched = live.watch(("d0",))
    live.observe(beat("d0", instance="b"))
    assert live.lost(watched) == ("d0", "worker d0 restarted")
    assert live.lost(live.watch(("d0",))) is None  # a new request may use it


def test_a_clean_stop_is_lost_at_once() -> None:
    live = Liveness()
    live.observe(beat("d0"))
    watched = live.watch(("d0",))
    live.observe(beat("d0", stopped=True))
    assert live.lost(watched) == ("d0", "worker d0 stopped")


def test_silence_while_the_gateway_was_cut_off_does_not_count() -> None:
    live = Liveness()
    live.observe(beat("d0"))
    watched = live.watch(("d0",))
    time.sleep(0.2)
    live.reconnected()
    assert live.lost(watched) is None


def test_placements_avoid_workers_that_went_quiet_before_the_conductor_notices() -> None:
    live = Liveness()
    live.observe(beat("d0"))
    live.observe(beat("d1", interval=10.0))
    assert live.quiet() == ()
    time.sleep(0.1)
    assert live.quiet() == ("d0",)
    assert live.instance("d0") == "a" and live.instance("nobody") is None


def test_a_worker_that_reconnected_since_is_named_but_not_lost() -> None:
    live = Liveness()
    live.observe(beat("d0"))
    since = live.connections(("d0", "unknown"))
    assert since == {"d0": 0} and live.reconnected_worker(since, ("d0", "unknown")) == ""
    live.observe(replace(beat("d0"), reconnections=1))
    assert live.reconnected_worker(since, ("d0",)) == "d0"
    assert live.lost(live.watch(("d0",))) is None  # alive: only its last events may be gone
    assert live.reconnected_worker(live.connections(("d0",)), ("d0",)) == ""  # a new attempt
