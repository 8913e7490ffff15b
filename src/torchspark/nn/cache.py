"""Networks rebuilt from shipped blueprints, kept per process and leased to tasks: the one network cache.

Spark evaluation and inference lease a copy per broadcast (one per running task: each PySpark task has its own
Python worker); the averaging rounds of ``averaging_via="spark"`` lease the network of their fit, so a reused Python
worker trains every round with the network it built in the first one instead of rebuilding it from the blueprint.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torchspark.nn.network import Network
from torchspark.validation import check_int

__all__ = ["NetworkCache"]


@dataclass
class _Entry:
    semaphore: threading.BoundedSemaphore
    limit: int
    free: list[Network] = field(default_factory=list)
    built: int = 0


class NetworkCache:
    """Networks rebuilt from broadcast blueprints, kept per Python process and leased to tasks.

    PySpark runs each task in a Python worker process and, with ``spark.python.worker.reuse`` (on in
    [`local_session`][torchspark.spark.local_session]), later tasks run in the same processes. A task leases a copy for
    a broadcast key; the copy goes back to the pool afterwards, so the next task in that process reuses it
    instead of deserialising the network again. A ``BoundedSemaphore(limit)`` per key caps how many leases -
    and so how many copies - exist at once in the process (threads beyond it wait).

    Args:
        max_keys: how many broadcast keys to keep; the oldest key's idle copies are dropped when a new key
            arrives, so repeated evaluations of changing networks do not pile up copies. 2 keeps the current and
            the previous network.
    """

    def __init__(self, max_keys: int = 2) -> None:
        self.max_keys = check_int("max_keys", max_keys, 1)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def _entry(self, key: str, limit: int) -> _Entry:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = _Entry(threading.BoundedSemaphore(limit), limit)
                self._entries[key] = entry
                while len(self._entries) > self.max_keys:
                    self._entries.popitem(last=False)
            self._entries.move_to_end(key)
            return entry

    @contextmanager
    def lease(self, key: str, limit: int, build: Callable[[], Network]) -> Iterator[Network]:
        """Hold one network copy for ``key`` while the ``with`` block runs.

        Args:
            key: the broadcast's key (one per shipped network).
            limit: most copies of this key alive at once in this process (the first lease fixes it).
            build: makes a new copy when no idle one exists (called without the lock held).
        """
        entry = self._entry(key, limit)
        entry.semaphore.acquire()
        try:
            with self._lock:
                net = entry.free.pop() if entry.free else None
            if net is None:
                net = build()
                with self._lock:
                    entry.built += 1
            try:
                yield net
            finally:
                with self._lock:
                    if self._entries.get(key) is entry:  # an evicted key's copy is simply dropped
                        entry.free.append(net)
        finally:
            entry.semaphore.release()

    def copies(self, key: str) -> int:
        """How many copies were built for ``key`` in this process (0 for an unknown or evicted key)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry.built if entry is not None else 0

    def keys(self) -> list[str]:
        """The cached keys, oldest first."""
        with self._lock:
            return list(self._entries)
