"""How many torch threads a step runs on: all the process may use while it prefills, fewer
while it only decodes (`kvstack serve`, where the front end shares the process)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepThreads:
    """`prefill` threads for a step that computes a prompt's tokens, `decode` for one that
    only decodes; None leaves torch's count as it is."""

    decode: int | None
    prefill: int | None
    current: int | None = None

    def apply(self, prefills: bool) -> None:
        """Set this thread's torch threads for the next step (set_num_threads is per calling
        thread under OpenMP: the engine's step thread must call it)."""
        wanted = (self.prefill if prefills else None) or self.decode
        if wanted is None or wanted == self.current:
            return
        torch.set_num_threads(wanted)
        self.current = wanted
