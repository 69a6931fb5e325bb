"""`loadgen trace gen`'s flags: one per `GenParams` field, grouped as the help shows them.

Every flag defaults to None (not given), so that a preset's value stands unless the flag
overrides it; the help shows the value used without a preset."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from loadgen.tracegen.params import DEFAULT_REQUESTS, TUNABLE, GenParams


@dataclass(frozen=True)
class Flag:
    field: str
    type: type
    metavar: str
    help: str


GROUPS = {
    "size and arrivals": (
        Flag("requests", int, "N", f"requests to write (default {DEFAULT_REQUESTS})"),
        Flag("duration", float, "S", "keep the arrivals before S seconds"),
        Flag("rate", float, "R", "requests/s, all turns counted"),
        Flag(
            "burstiness",
            float,
            "K",
            "gamma shape of the gaps between new sessions: 1 Poisson, <1 burstier, >1 more even",
        ),
    ),
    "lengths (lognormal; tokens)": (
        Flag("input_mean", float, "T", "mean new message of a first turn or single request"),
        Flag("input_sigma", float, "X", "spread of new messages (sigma of the log)"),
        Flag("input_max", int, "T", "context window: no prompt is longer"),
        Flag("turn_input_mean", float, "T", "mean new message of a later turn"),
        Flag("output_mean", float, "T", "mean answer"),
        Flag("output_sigma", float, "X", "spread of answers"),
        Flag("output_max", int, "T", "longest answer"),
    ),
    "multi-turn sessions": (
        Flag("session_share", float, "F", "share of requests in multi-turn sessions"),
        Flag("turns_mean", float, "N", "mean turns per session (1 + geometric, >= 2)"),
        Flag("think_time", float, "S", "mean seconds between a session's turns"),
    ),
    "shared prefixes (system prompts, tool definitions, documents)": (
        Flag("system_prompts", int, "K", "distinct shared prefixes (0: none)"),
        Flag("system_tokens", int, "T", "their mean length"),
        Flag("system_sigma", float, "X", "spread of their lengths (0: all equal)"),
        Flag("system_zipf", float, "S", "popularity: prefix k is chosen ~ 1/(k+1)^S"),
        Flag("system_share", float, "F", "share of sessions and single requests with one"),
    ),
    "long-context outliers": (
        Flag("long_share", float, "F", "share of first messages that are long"),
        Flag("long_input", int, "T", "their mean length"),
    ),
    "reuse": (
        Flag(
            "target_reuse",
            float,
            "F",
            "tune to this reuse ceiling (an explicit value of "
            "the tuned flag drops a preset's target)",
        ),
        Flag(
            "tune",
            str,
            "KNOB",
            f"what --target-reuse tunes: {' or '.join(TUNABLE)} "
            "(default: system-tokens with shared prefixes, else session-share)",
        ),
        Flag("seed", int, "N", "the same flags and seed write the same bytes"),
    ),
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    defaults = GenParams()
    for title, flags in GROUPS.items():
        group = parser.add_argument_group(title)
        for flag in flags:
            default = getattr(defaults, flag.field)
            shown = "" if default is None or flag.field == "requests" else f" (default {default})"
            group.add_argument(
                "--" + flag.field.replace("_", "-"),
                dest=flag.field,
                type=flag.type,
                metavar=flag.metavar,
                help=flag.help + shown,
            )
