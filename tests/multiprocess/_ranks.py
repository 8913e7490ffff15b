"""Start ``world`` real processes that each run one rank of a torch.distributed group, and collect them.

The processes come from the workers' own context (:func:`torchspark.parallel.bootstrap.worker_context`: forked from
a fork server that imported torch once), not ``spawn``: a spawned rank imports torch afresh, 2-3 CPU-s each, which
made these tests CPU-bound on a 2-core machine.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from torchspark.parallel.bootstrap import worker_context


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    target: Callable[..., None],
    world: int,
    *args: Any,
    reports: bool = True,
    check_exit: bool = False,
    timeout_s: float = 180.0,
) -> list[dict[str, Any]]:
    """Run ``target(rank, world, port, *args[, queue])`` in ``world`` processes.

    With ``reports`` each rank puts one dict (with its ``"rank"``) on the queue passed last; they come back sorted
    by rank. Without, the ranks' exit codes must all be 0. ``check_exit`` also demands exit code 0 with reports.
    """
    ctx = worker_context()
    out = ctx.Queue() if reports else None
    port = free_port()
    extra = (out,) if reports else ()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, *extra), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=timeout_s) for _ in procs] if out is not None else []
    finally:
        for p in procs:
            p.join(timeout=30 if reports else timeout_s)
            if p.is_alive():
                p.kill()
    codes = [p.exitcode for p in procs]
    if check_exit or not reports:
        assert codes == [0] * world, codes
    return sorted(got, key=lambda r: r["rank"])
