"""When the supervisor restarts a child, and when it gives up: plain numbers, no clock."""

from __future__ import annotations

from services.stack.restarts import RestartHistory, RestartPolicy, backoff
from services.stack.supervisor import describe_exit

POLICY = RestartPolicy()


def test_backoff_doubles_from_one_second_up_to_its_cap() -> None:
    assert [backoff(POLICY, n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_a_child_that_dies_at_once_waits_longer_each_time_then_is_given_up() -> None:
    history = RestartHistory(POLICY, started_at=0.0)
    delays, now = [], 0.0
    for _ in range(5):
        delays.append(history.exited(now))
        now += delays[-1]
        history.started(now)
    assert delays == [1, 2, 4, 8, 16]  # 5 restarts within 120 s
    assert history.exited(now) is None  # the sixth exit gives up


def test_a_child_that_stayed_up_a_while_starts_its_backoff_over() -> None:
    history = RestartHistory(POLICY, started_at=0.0)
    assert history.exited(1.0) == 1
    history.started(2.0)
    assert history.exited(3.0) == 2
    history.started(5.0)
    assert history.exited(5.0 + POLICY.stable_after) == 1


def test_restarts_older_than_the_window_do_not_count_towards_giving_up() -> None:
    policy = RestartPolicy(max_restarts=2, window=120, stable_after=1000)
    history = RestartHistory(policy, started_at=0.0)
    assert history.exited(0.0) is not None
    assert history.exited(10.0) is not None
    assert history.exited(20.0) is None  # a third within 120 s
    history = RestartHistory(policy, started_at=0.0)
    history.exited(0.0)
    history.exited(10.0)
    assert history.exited(125.0) is not None  # the first has left the window


def test_an_exit_by_signal_is_named() -> None:
    assert describe_exit(-9) == "code -9 (SIGKILL)"
    assert describe_exit(1) == "code 1"
