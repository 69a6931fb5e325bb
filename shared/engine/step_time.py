"""The TBT a worker gives now: a moving average of its step times. The live engine loop and
the simulator's decode nodes keep it the same way (no torch here: the simulator imports
it)."""

from __future__ import annotations

# The weight of the newest step: about the last five steps count.
STEP_SMOOTHING = 0.2


def smoothed(mean_seconds: float, step_seconds: float) -> float:
    """The moving average after one more step of `step_seconds`."""
    return mean_seconds + STEP_SMOOTHING * (step_seconds - mean_seconds)
