"""Asynchronous prefetch: a background thread loads the next minibatches while the current one trains.

DL4J's ``workerPrefetchNumBatches``. Loading a batch file, decoding Arrow rows or deserialising a batch happens
on the prefetch thread; the training thread only waits when the loader is slower than training (the ``data_wait``
phase in the training stats shows how long).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Generic, TypeVar

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
                item = get_within(self._queue, self._timeout_s, partial(_timeout_message, self._timeout_s))
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


class _OnDemand(Generic[T]):
    """``depth=0``: no read-ahead, yet every wait for an item is bounded. A loader thread fetches the next item only
    when the consumer asks for it, so at most one item is ever loaded and not yet trained on."""

    def __init__(self, source: Iterable[T], timeout_s: float) -> None:
        self._source = iter(source)
        self._timeout_s = timeout_s
        self._requests: queue.Queue[bool] = queue.Queue()
        self._items: queue.Queue[object] = queue.Queue()

    def _run(self) -> None:
        while self._requests.get():
            try:
                self._items.put(next(self._source, _END))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
                self._items.put(_Failure(e))
                return

    def __iter__(self) -> Iterator[T]:
        # started here, not in __init__: a generator that is never iterated never runs its finally
        threading.Thread(target=self._run, name="torchspark-load", daemon=True).start()
        try:
            while True:
                self._requests.put(True)
                item = get_within(self._items, self._timeout_s, partial(_timeout_message, self._timeout_s))
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            self._requests.put(False)  # a loader stuck in the source exits when the source returns (daemon thread)


def _timeout_message(timeout_s: float) -> str:
    return (
        f"no minibatch arrived within data_timeout_s={timeout_s}; the data source is stuck or very slow (raise "
        "data_timeout_s for slow storage)"
    )


def prefetch(
    source: Iterable[T], depth: int, timeout_s: float = 600.0, transform: Callable[[T], T] | None = None
) -> Iterator[T]:
    """Iterate ``source`` through a bounded background queue of ``depth`` items (0 = no read-ahead).

    Args:
        source: the items (batch paths turned into batches by ``transform``, or batches).
        depth: how many items may wait ready; 2 (the default of the masters) hides most I/O; more only helps with
            bursty storage and costs memory. 0 loads each item only when it is asked for (no read-ahead), on a
            loader thread so that ``timeout_s`` still bounds the wait.
        timeout_s: how long the consumer waits for one item before [`WaitTimeout`][torchspark.errors.WaitTimeout].
        transform: applied on the prefetch thread (e.g. ``load_batch``).
    Exceptions raised by the source or the transform are re-raised in the consumer.
    """
    items: Iterable[T] = source if transform is None else map(transform, source)
    if depth <= 0:
        return iter(_OnDemand(items, timeout_s))
    return iter(_Prefetcher(items, depth, timeout_s))
