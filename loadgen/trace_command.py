"""`loadgen trace`: write Mooncake traces from parameters (`gen`), print a trace's
statistics (`stats`), and turn public traces without prefix information into Mooncake
traces (`import`). See docs/loadgen.md, "Traces"."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace

import orjson

from loadgen.trace import load_trace, write_trace
from loadgen.tracegen import flags
from loadgen.tracegen.params import FIELDS, GenParams
from loadgen.tracegen.presets import PRESETS
from loadgen.tracegen.tune import Tuned, generate, knob_value
from loadgen.traceimport import FORMATS, import_csv
from loadgen.tracestats import format_stats, trace_stats
from shared.errors import KvstackError

REUSE_WARNING = 0.05  # a tuned trace further than this from its target says so
KNOB_FIELDS = {"system-tokens": "system_tokens", "session-share": "session_share"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace", help="generate, inspect and import Mooncake traces", description=__doc__
    )
    commands = p.add_subparsers(dest="trace_command", required=True, metavar="SUBCOMMAND")
    add_gen_parser(commands)
    add_stats_parser(commands)
    add_import_parser(commands)


def add_gen_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "gen",
        help="write a trace from parameters or a preset",
        description="Write a Mooncake trace from a workload's parameters.",
    )
    p.add_argument("--output", "-o", required=True, metavar="PATH", help="the JSONL to write")
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="start from a named workload: "
        + "; ".join(f"{name}: {preset.summary}" for name, preset in PRESETS.items()),
    )
    p.add_argument("--quiet", action="store_true", help="nothing on stderr but errors")
    flags.add_flags(p)
    p.set_defaults(run=run_gen)


def add_stats_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "stats",
        help="print a trace's statistics",
        description="Rate, burstiness, lengths, reuse ceiling, sessions "
        "and shared prefixes of a Mooncake trace.",
    )
    p.add_argument("trace", metavar="FILE", help="Mooncake trace (JSONL)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=run_stats)


def add_import_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "import",
        help="convert a BurstGPT or Azure CSV (reuse 0)",
        description="Convert a trace without prefix information into a "
        "Mooncake trace whose blocks are all distinct (reuse 0).",
    )
    p.add_argument("input", metavar="CSV", help="the trace to convert")
    p.add_argument("--format", required=True, choices=sorted(FORMATS), help="its columns")
    p.add_argument("--output", "-o", required=True, metavar="PATH", help="the JSONL to write")
    p.add_argument("--model", help="burstgpt: only this Model's rows (e.g. ChatGPT, GPT-4)")
    p.add_argument("--max-requests", type=int, metavar="N", help="the first N requests")
    p.set_defaults(run=run_import)


def gen_params(args: argparse.Namespace) -> GenParams:
    """A preset (or the defaults), then the flags given."""
    base = PRESETS[args.preset].params if args.preset else GenParams()
    given = {name: getattr(args, name) for name in FIELDS if getattr(args, name) is not None}
    params = replace(base, **given).check()
    if KNOB_FIELDS[params.knob] in given and "target_reuse" not in given:
        return replace(params, target_reuse=None)  # the value asked for wins over the target
    return params


def run_gen(args: argparse.Namespace) -> int:
    say = (lambda _: None) if args.quiet else (lambda m: print(f"[trace gen] {m}", file=sys.stderr))
    tuned = generate(gen_params(args), say)
    write_trace(args.output, tuned.rows)
    say(gen_summary(tuned, args.output))
    return 0


def gen_summary(tuned: Tuned, path: str) -> str:
    rows, params = tuned.rows, tuned.params
    text = (
        f"wrote {len(rows)} requests over {rows[-1].timestamp:.0f} s to {path}; "
        f"reuse ceiling {tuned.reuse:.3f}"
    )
    if params.target_reuse is None:
        return text
    text += f" (target {params.target_reuse}, --{params.knob} {knob_value(params)})"
    if abs(tuned.reuse - params.target_reuse) > REUSE_WARNING:
        text += f"; the target is out of reach of --{params.knob}"
    return text


def run_stats(args: argparse.Namespace) -> int:
    stats = trace_stats(load_trace(args.trace))
    if args.json:
        print(orjson.dumps(asdict(stats), option=orjson.OPT_INDENT_2).decode())
    else:
        print(format_stats(stats))
    return 0


def run_import(args: argparse.Namespace) -> int:
    if args.model is not None and args.format != "burstgpt":
        raise KvstackError("--model applies to --format burstgpt only")
    if args.max_requests is not None and args.max_requests <= 0:
        raise KvstackError(f"--max-requests must be positive, got {args.max_requests}")
    imported = import_csv(args.input, args.format, args.model, args.max_requests)
    write_trace(args.output, imported.rows)
    print(
        f"wrote {len(imported.rows)} requests to {args.output}; skipped "
        f"{imported.skipped} with zero prompt or answer tokens",
        file=sys.stderr,
    )
    return 0
