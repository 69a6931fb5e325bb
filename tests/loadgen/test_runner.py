"""The runner: schedule, the client-side concurrency cap, and stopping on Ctrl-C."""

from __future__ import annotations

import asyncio
import io
import os
import signal

import numpy as np

from loadgen.client import Target
from loadgen.datasets import Prompt
from loadgen.progress import Progress
from loadgen.runner import Runner
from tests.loadgen.conftest import API_KEY, MODEL


def prompts(count: int, output_len: int) -> list[Prompt]:
    return [Prompt(i, np.array([1000 + i], dtype=np.int32), 1, output_len) for i in range(count)]


def runner(server, max_concurrency=None) -> Runner:
    return Runner(
        Target(server.url, MODEL, api_key=API_KEY), max_concurrency, Progress(0, io.StringIO())
    )


async def test_every_prompt_is_sent_no_earlier_than_its_arrival(fake_server) -> None:
    arrivals = [0.0, 0.05, 0.1, 0.3]
    outcome = await runner(fake_server).run(prompts(4, 2), arrivals)
    assert [r.index for r in outcome.records] == [0, 1, 2, 3]
    assert all(r.success for r in outcome.records)
    # asyncio may wake a timer up to its clock resolution early
    assert all(r.start_time >= a - 1e-3 for r, a in zip(outcome.records, arrivals))
    assert not outcome.interrupted and outcome.duration >= outcome.records[-1].start_time


async def test_max_concurrency_caps_requests_in_flight(fake_server) -> None:
    outcome = await runner(fake_server, max_concurrency=2).run(prompts(6, 3), [0.0] * 6)
    assert len(outcome.records) == 6 and all(r.success for r in outcome.records)
    assert fake_server.peak_in_flight == 2
    waited = [r for r in outcome.records if r.queue_time > 0]
    assert len(waited) >= 4  # all sent at t=0: four had to wait for a slot
    assert all(r.start_time >= r.queue_time for r in waited)


async def wait_for_records(run: Runner, count: int) -> None:
    while len(run.records) < count:
        await asyncio.sleep(0.01)


async def test_ctrl_c_stops_sending_and_keeps_what_finished(slow_server) -> None:
    run = runner(slow_server, max_concurrency=2)
    task = asyncio.create_task(run.run(prompts(4, 20), [0.0, 0.0, 30.0, 30.0]))
    await wait_for_records(run, 2)
    os.kill(os.getpid(), signal.SIGINT)  # the runner's handler turns it into a stop
    outcome = await asyncio.wait_for(task, 10)
    assert outcome.interrupted and outcome.num_unsent == 2 and outcome.num_cancelled == 0
    assert [r.index for r in outcome.records] == [0, 1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler removed


async def test_ctrl_c_cancels_requests_in_flight(slow_server) -> None:
    run = runner(slow_server, max_concurrency=2)
    task = asyncio.create_task(run.run(prompts(6, 20), [0.0] * 6))
    await wait_for_records(run, 1)
    run.stop.set()
    outcome = await asyncio.wait_for(task, 10)
    assert outcome.interrupted and outcome.num_unsent == 0
    assert outcome.num_cancelled >= 1
    assert len(outcome.records) + outcome.num_cancelled == 6
    assert all(r.success for r in outcome.records)
