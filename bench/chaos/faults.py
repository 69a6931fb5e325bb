"""The faults of a chaos run: which child each one kills (SIGKILL to its process group, as
the OOM killer or a node loss would) or nats-server restarted, and when the stack has it
back (the supervisor restarted it and it answers over NATS again)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass

from services.stack.stack import Stack
from shared import subjects
from shared.errors import KvstackError
from shared.messages import StatsRequest
from shared.runtime.bus import ServiceUnavailable

FAULTS = ("prefill", "decode", "kvstore", "conductor", "attention-worker", "nats")


@dataclass(frozen=True)
class Fault:
    name: str  # what the table calls it
    child: str = ""  # the stack's child it kills ("": nats-server is restarted)
    service: str = ""  # the child's service (how to ask it whether it is back)


def choose(stack: Stack, names: list[str]) -> list[Fault]:
    """One fault per name, each on a child this stack runs; a clear error otherwise."""
    unknown = sorted(set(names) - set(FAULTS))
    if unknown:
        raise KvstackError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    return [_fault(stack, name) for name in names]


def _fault(stack: Stack, name: str) -> Fault:
    if name == "nats":
        if stack.nats is None:
            raise KvstackError("the nats fault needs the stack's own nats-server (no --nats)")
        return Fault("nats")
    children = [p.name for p in stack.processes if p.service == name]
    if not children:
        raise KvstackError(f"this stack runs no {name} to kill")
    return Fault(name, children[-1], name)  # the last: e.g. decode-1, so decode-0 serves


def inject(stack: Stack, fault: Fault) -> None:
    if not fault.child:
        stack.restart_nats()
        return
    try:
        os.killpg(stack.process(fault.child).popen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_back(stack: Stack, fault: Fault, restarts_before: int, timeout: float) -> float | None:
    """Seconds until the faulted part is back (restarted and answering), None past
    `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        restarted = not fault.child or stack.restarts(fault.child) > restarts_before
        if restarted and asyncio.run(_answers(stack, fault)):
            return time.monotonic() - started
        time.sleep(0.25)
    return None


async def _answers(stack: Stack, fault: Fault) -> bool:
    try:
        bus = await stack.bus("chaos-probe", connect_timeout=2.0)
    except KvstackError:
        return False
    subject = (
        subjects.conductor_stats()
        if fault.service in ("conductor", "")
        else subjects.worker_stats(fault.service, fault.child)
    )
    try:
        await bus.request(subject, StatsRequest(), 2.0)
        return True
    except ServiceUnavailable:
        return False
    finally:
        await bus.nc.close()
