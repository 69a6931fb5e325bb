"""A TCP relay that delays every byte by a fixed time in each direction: the delay of a
slow link, where the kernel has no `netem` qdisc. Each chunk read is written on after
`--delay-ms`, in order, so the stream stays whole and only arrives later; it holds back
at most a few chunks, so a slow receiver slows the sender down, as a link would.

    python relay.py --listen 127.0.0.1:9300 --upstream 10.0.0.5:9200 --delay-ms 20

It prints "listening" once it accepts connections; SIGTERM ends it. Standalone (standard
library only): it runs in another network namespace with this host's Python.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time

CHUNK = 1 << 16
QUEUED_CHUNKS = 4  # at most this many chunks held back per direction


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader to writer, each chunk `delay` seconds after it was read."""
    # NOTE: bounded, so a slow reader holds the writer back as a real link would: an
    # unbounded queue let a sender believe megabytes were on their way that were not
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=QUEUED_CHUNKS)

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    delivering = asyncio.ensure_future(deliver())
    try:
        while data := await reader.read(CHUNK):
            put = asyncio.ensure_future(queue.put((time.monotonic() + delay, data)))
            await asyncio.wait({put, delivering}, return_when=asyncio.FIRST_COMPLETED)
            if delivering.done():  # the other side went: stop reading
                put.cancel()
                break
    except asyncio.CancelledError:  # the relay stops: what is held back goes nowhere
        delivering.cancel()
        raise
    if not delivering.done():  # the end of the stream, after what is held back
        await queue.put((0.0, b""))
    await delivering


async def relay(client_r, client_w, upstream: tuple[str, int], delay: float) -> None:
    try:
        server_r, server_w = await asyncio.open_connection(*upstream)
    except OSError:
        client_w.close()
        return
    try:
        await asyncio.gather(pump(client_r, server_w, delay), pump(server_r, client_w, delay))
    except (ConnectionError, OSError, asyncio.CancelledError):  # a peer went, or we stop
        pass
    finally:
        for writer in (client_w, server_w):
            writer.close()


async def main(listen: tuple[str, int], upstream: tuple[str, int], delay: float) -> None:
    server = await asyncio.start_server(
        lambda r, w: relay(r, w, upstream, delay), listen[0], listen[1]
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print("listening", flush=True)
    async with server:
        await stop.wait()


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", type=address, required=True)
    p.add_argument("--upstream", type=address, required=True)
    p.add_argument("--delay-ms", type=float, default=20.0)
    args = p.parse_args()
    asyncio.run(main(args.listen, args.upstream, args.delay_ms / 1000))
