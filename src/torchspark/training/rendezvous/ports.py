"""Opening a listener on a port from a configured range (``port_range`` of the mesh options).

Firewalled clusters open a known range between executors and to the driver; every listener torchspark starts
(the driver's rendezvous relay and progress server, worker 0's store) goes through `listen_in_range`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeVar

from torchspark.errors import SetupError

__all__ = ["listen_in_range"]

T = TypeVar("T")


def listen_in_range(open_at: Callable[[int], T], port_range: tuple[int, int] | None, what: str, port: int = 0) -> T:
    """``open_at(port)`` for the first port of ``port_range`` it can bind, in random order (concurrent fits on
    one host then rarely race for the same port); ``open_at(port)`` when no range is set (0 = any free port).

    ``open_at`` must raise ``OSError`` or ``RuntimeError`` (torch's ``TCPStore``) when the port is taken.

    Raises:
        SetupError: no port of the range could be bound, naming the range and the last error.
    """
    if port_range is None:
        return open_at(port)
    first, last = port_range
    candidates = list(range(first, last + 1))
    random.shuffle(candidates)
    error: BaseException | None = None
    for candidate in candidates:
        try:
            return open_at(candidate)
        except (OSError, RuntimeError, SetupError) as e:  # taken: try the next one
            error = e
    raise SetupError(
        f"{what}: no free port in port_range={port_range} (last error: {error}); widen the range or "
        "stop what holds its ports"
    )
