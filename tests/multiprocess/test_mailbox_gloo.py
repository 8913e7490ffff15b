"""The gloo mailbox of bounded-staleness sharing between three real processes: a sender thread and one receiver
thread per peer in each process, large and empty payloads, unequal message counts, a collective between epochs."""

from __future__ import annotations

import multiprocessing
import socket

import _mailbox_worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_message_arrives_once_in_order_with_its_payload() -> None:
    world = 3
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_mailbox_worker.run, args=(r, world, port, 2)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0] * world, codes
