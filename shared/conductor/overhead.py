"""The stack's own time before a prefill starts that no queue explains: the hops between
gateway, conductor and workers, the decode worker's reservation, the prefix planning.

Learned from finished requests that were placed on an idle prefill worker (a predicted
queue under FLOOR_SECONDS): the median of their measured queue less the predicted one.
The conductor adds it to the TTFT a placement reports, not to its decisions: it is the
same whichever worker is chosen, and the simulator, which has no such path, learns 0.
Plain data, no I/O."""

from __future__ import annotations

import statistics
from collections import deque

from shared.conductor.accuracy import FLOOR_SECONDS
from shared.messages import RequestDone

WINDOW = 256  # the latest requests it learns from
MIN_SAMPLES = 8  # before this many, the overhead is 0


class PathOverhead:
    def __init__(self, window: int = WINDOW) -> None:
        self.samples: deque[float] = deque(maxlen=window)
        self.seconds = 0.0

    def observe(self, done: RequestDone) -> None:
        """Learn from `done` if it was placed once on an idle worker and its queue measured."""
        compute_queue = done.predicted_queue - done.predicted_overhead
        if done.predicted_ttft <= 0 or done.queue < 0 or compute_queue >= FLOOR_SECONDS:
            return
        self.samples.append(done.queue - compute_queue)
        if len(self.samples) >= MIN_SAMPLES:
            self.seconds = max(0.0, statistics.median(self.samples))
