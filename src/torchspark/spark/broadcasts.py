"""Releasing what a Spark broadcast holds on the driver, once the jobs that read it have ended.

``Broadcast.unpersist()`` drops only the executors' copies: the driver keeps the value's blocks in its JVM
(until a JVM garbage collection lets Spark's ``ContextCleaner`` notice the broadcast is unreachable) and PySpark
keeps the pickled value in a file under the SparkContext's temporary directory until the session stops. A fit
broadcasts its task (the network's weights) once per attempt, and evaluation broadcasts the network once per call,
so a long session with recoveries or early stopping would grow the driver by one copy of the weights each time.
`destroy_broadcast` frees all three at once; `driver_broadcast_files` counts what is left (tests and
the soak benchmark check it returns to its value before a fit).
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["destroy_broadcast", "driver_broadcast_files"]

log = logging.getLogger(__name__)


def destroy_broadcast(broadcast: Any) -> None:
    """Destroy ``broadcast`` everywhere (executors, the driver's JVM blocks, PySpark's file on the driver).

    Call it only after every job that reads the broadcast has ended: a later task reading it fails. It never
    blocks on the executors (Spark removes their copies in the background) and never raises: when the session is
    already stopped there is nothing left to free.

    Example: ``task_bc = sc.broadcast(task)`` ... ``finally: destroy_broadcast(task_bc)``.
    """
    try:
        broadcast.destroy(blocking=False)
    except Exception:  # noqa: BLE001 - a stopped context or a dead JVM: nothing is left to free
        log.debug("could not destroy a broadcast", exc_info=True)


def driver_broadcast_files(sc: Any) -> int:
    """How many broadcasts PySpark still holds on the driver (each keeps one file in the SparkContext's temporary
    directory until it is destroyed); 0 for a session without one (Spark Connect)."""
    directory = getattr(sc, "_temp_dir", None)
    if not directory or not os.path.isdir(directory):
        return 0
    return sum(1 for name in os.listdir(directory) if os.path.isfile(os.path.join(directory, name)))
