"""`python -m bench engine-thread` builds and steps where each placement says."""

from __future__ import annotations

import threading

from bench.engine_thread import placed


def test_each_placement_builds_and_steps_on_its_threads() -> None:
    where = {}
    for placement in ("main", "split", "engine-thread"):
        build, step = placed(placement)
        where[placement] = (build(threading.get_ident), step(threading.get_ident))
    main = threading.get_ident()
    assert where["main"] == (main, main)
    built, stepped = where["split"]
    assert len({built, stepped, main}) == 3  # the services before: loaded here, stepped there
    built, stepped = where["engine-thread"]
    assert built == stepped != main  # the services now
