"""Block ids for planned prompts, chained as Mooncake's are: an id names a 512-token block
and everything before it, so two prompts share the id at position i only if they share
every block up to i.

A prompt that extends another (a session's next turn, or a first turn after a shared
prefix) keeps the other's *full* blocks and gets fresh ids from there on: the other's last,
partial block is not a block of the extension, whose block at that position holds more
tokens. Every block past the shared ones holds tokens of this prompt's own new message, so
a fresh id is exactly right."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from loadgen.trace import TRACE_BLOCK_SIZE
from loadgen.tracegen.plan import Plan, Planned


def num_blocks(length: int) -> int:
    return -(-length // TRACE_BLOCK_SIZE)


def full_blocks(length: int) -> int:
    return length // TRACE_BLOCK_SIZE


def arrival_order(requests: Sequence[Planned]) -> list[int]:
    """Indexes by time; a tie keeps plan order, so a parent always comes first."""
    return sorted(range(len(requests)), key=lambda i: (requests[i].time, i))


def assign(plan: Plan, order: Sequence[int]) -> list[tuple[int, ...]]:
    """Each planned request's ids (by plan index), fresh ids numbered in `order`, which
    must put every parent before its child."""
    requests = plan.requests
    ids: list[tuple[int, ...]] = [()] * len(requests)
    prefix_ids: dict[int, tuple[int, ...]] = {}
    fresh = itertools.count()
    for i in order:
        request = requests[i]
        if request.parent is not None:
            base = ids[request.parent][: full_blocks(requests[request.parent].input_length)]
        elif request.prefix is not None:
            if request.prefix not in prefix_ids:
                length = full_blocks(plan.prefix_lengths[request.prefix])
                prefix_ids[request.prefix] = take(fresh, length)
            base = prefix_ids[request.prefix]
        else:
            base = ()
        ids[i] = base + take(fresh, num_blocks(request.input_length) - len(base))
    return ids


def take(fresh: Iterator[int], count: int) -> tuple[int, ...]:
    return tuple(itertools.islice(fresh, count))


def renumber(id_lists: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The same equalities, ids numbered 0, 1, ... by first appearance."""
    names: dict[int, int] = {}
    return [tuple(names.setdefault(i, len(names)) for i in ids) for ids in id_lists]
