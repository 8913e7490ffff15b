"""Asynchronous prefetch: a background thread loads the next minibatches while the current one trains.

DL4J's ``workerPrefetchNumBatches``. Loading a batch file, decoding Arrow rows or deserialising a batch happens
on the prefetch thread; the training thread only waits when the loader is slower than training (the ``data_wait``
phase in the training stats shows how long).
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from torchspark.training.waiting import get_within, put_until_stopped

__all__ = ["prefetch"]

T = TypeVar("T")
_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Prefetcher(Generic[T]):
    def __init__(self, source: Iterable[T], depth: int, timeout_s: float) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._timeout_s = timeout_s
        self._thread = threading.Thread(target=self._run, args=(source,), name="torchspark-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        return put_until_stopped(self._queue, item, self._stop)

    def _run(self, source: Iterable[T]) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(_Failure(e))

    def __iter__(self) -> Iterator[T]:
        try:
            while True:
                item = get_within(self._queue, self._timeout_s, lambda: (
                    f"no minibatch arrived within data_timeout_s={self._timeout_s}; the data source is stuck "
                    "or very slow (raise data_timeout_s for slow storage)"))
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item  # type: ignore[misc]
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


def prefetch(source: Iterable[T], depth: int, timeout_s: float = 600.0,
             transform: Callable[[T], T] | None = None) -> Iterator[T]:
    """Iterate ``source`` through a bounded background queue of ``depth`` items (0 = synchronous).

    Args:
        source: the items (batch paths turned into batches by ``transform``, or batches).
        depth: how many items may wait ready; 2 (the default of the masters) hides most I/O; more only helps with
            bursty storage and costs memory.
        timeout_s: how long the consumer waits for one item before :class:`WaitTimeout`.
        transform: applied on the prefetch thread (e.g. ``load_batch``).
    Exceptions raised by the source or the transform are re-raised in the consumer.
    """
    items: Iterable[T] = source if transform is None else map(transform, source)
    if depth <= 0:
        return iter(items)
    return iter(_Prefetcher(items, depth, timeout_s))
