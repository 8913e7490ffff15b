"""Turns the progress channel's per-worker messages into fit-wide events for [`TrainingListener`][torchspark.listeners.TrainingListener] objects.

Workers report every ``progress_every`` minibatches ([`ProgressUpdate`][torchspark.training.ProgressUpdate]: counts
within the epoch, the latest loss, sharing traffic so far) and, when asked, the score they all agree on
([`ScoreReport`][torchspark.training.ScoreReport]). [`TrainingEvents`][torchspark.listeners.TrainingEvents] keeps the latest of each per worker and

  1. on every progress report, sums them into an [`IterationEvent`][torchspark.listeners.IterationEvent] (examples/s since the fit started);
  2. closes epoch ``e`` once every worker reported an epoch after ``e`` (or gradient sharing's epoch score for
     ``e`` arrived: an all-reduce every worker joined), or at the end of a successful fit, and emits an
     [`EpochEvent`][torchspark.listeners.EpochEvent] per epoch, in order;
  3. at the end, emits [`FitEnded`][torchspark.listeners.FitEnded] and waits for each listener to finish, at most its
     [`end_timeout_s`][torchspark.listeners.TrainingListener.end_timeout_s]; for a listener seen hung (still in a
     call begun before the end that has run `HUNG_CALL_S` or more: its server stopped answering; or, for a
     listener the previous fit's end gave up on, still in any call begun before the end), at most its
     [`hung_end_timeout_s`][torchspark.listeners.TrainingListener.hung_end_timeout_s] (10 s by default) instead.
The events are built under one lock, so listeners see them in order whichever thread delivers the messages; each
listener is then called on a thread of its own (a bounded queue,
`CallQueue`), so a stuck listener holds up neither the progress
channel (heartbeats) nor the other listeners, and cannot keep ``fit()`` from returning.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from torchspark.listeners.events import EpochEvent, FitEnded, FitStarted, IterationEvent, TrainingListener
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.progress.dispatch import CallQueue

__all__ = ["TrainingEvents", "network_params", "HUNG_CALL_S"]

log = logging.getLogger(__name__)

#: a listener call that has run this long when the fit ends is a listener seen hung (step 3): a tracking call to a
#: server that answers takes well under a second
HUNG_CALL_S = 10.0
#: listeners the end of a fit gave up on (still running after their wait): seen hung at the next end as soon as they
#: are in a call again then (a hung server makes every fit's first call hang)
_ABANDONED: weakref.WeakSet[Any] = weakref.WeakSet()


def network_params(network: Any) -> dict[str, Any]:
    """The network's settings as a flat JSON-ready dict (logged as run parameters)."""
    return {
        "module": type(network.module).__name__,
        "num_params": int(network.num_params()),
        "updater": network.updater.to_dict(),
        "loss": [lo.name for lo in network.losses],
        "seed": network.seed,
        "weight_decay": network.weight_decay,
        "l1": network.l1,
        "gradient_clip": network.gradient_clip,
        "memory_format": network.memory_format,
        "device": str(network.device),
    }


def _deliver(listener: TrainingListener, method: str, event: Any) -> None:
    try:
        getattr(listener, method)(event)
    except Exception:  # a broken listener must never stop the fit or the other listeners
        log.warning("training listener %r failed in %s; ignored", listener, method, exc_info=True)


def _end_wait(listener: TrainingListener, calls: CallQueue | None) -> float:
    """Step 3 (before ``on_fit_end`` is queued): the listener's ``end_timeout_s``, or its ``hung_end_timeout_s``
    when it was seen hung."""
    wait = float(getattr(listener, "end_timeout_s", 60.0))
    running = calls.running_s() if calls is not None else 0.0
    try:
        abandoned = listener in _ABANDONED
    except TypeError:  # unhashable
        abandoned = False
    if running >= HUNG_CALL_S or (running > 0 and abandoned):
        hung = float(getattr(listener, "hung_end_timeout_s", 10.0))
        if hung < wait:
            log.warning(
                "training listener %r has been stuck in one call for %.0f s (its server stopped answering?); the "
                "end of the fit waits hung_end_timeout_s=%g s for it, not end_timeout_s=%g s",
                listener,
                running,
                hung,
                wait,
            )
            return hung
    return wait


class TrainingEvents:
    """One fit's event source: feed it the channel's messages, it calls the listeners.

    Args:
        listeners: the [`TrainingListener`][torchspark.listeners.TrainingListener] objects to call.
        runner: names the route (``"SparkNetwork"``, ``"ParallelWrapper"``).
        master: the training master (its ``to_dict()`` goes into [`FitStarted`][torchspark.listeners.FitStarted]).
        network: the driver's network (its counters at the start and [`network_params`][torchspark.listeners.network_params]).
        epochs: epochs of this fit.
        num_workers: workers of this fit; epochs close as every one of them moves on.
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(
        self,
        listeners: Sequence[TrainingListener],
        *,
        runner: str,
        master: Any,
        network: Any,
        epochs: int,
        num_workers: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.listeners = list(listeners)
        self._clock = clock
        self._lock = threading.Lock()
        self._started = FitStarted(
            runner=runner,
            epochs=epochs,
            num_workers=num_workers,
            start_epoch=network.epoch,
            start_iteration=network.iteration,
            master=master.to_dict(),
            network=network_params(network),
        )
        self._t0 = clock()
        self._iters: dict[tuple[int, int], int] = {}  # (rank, epoch) -> minibatches within the epoch
        self._examples: dict[tuple[int, int], int] = {}  # (rank, epoch) -> examples within the epoch
        self._traffic: dict[tuple[int, int], tuple[int, int]] = {}  # (rank, epoch) -> (sent, dense) so far in fit
        self._epoch_scores: dict[tuple[int, int], float] = {}  # (rank, epoch) -> latest loss in that epoch
        self._latest_score: dict[int, float] = {}
        self._rank_epoch: dict[int, int] = {}
        self._reports: dict[int, list[ScoreReport]] = {}
        self._next_epoch = 0
        self._last_close = self._t0
        self._last_cum = (0, 0)
        self._queues: list[CallQueue | None] = [None] * len(self.listeners)  # one thread per listener, when used

    # ------------------------------------------------------------------ feeding
    def start(self) -> None:
        """Emit [`FitStarted`][torchspark.listeners.FitStarted] (before the workers start)."""
        for listener in self.listeners:  # on the caller's thread: its thread-local state (an active MLflow run)
            if callable(getattr(listener, "on_fit_called", None)):
                _deliver(listener, "on_fit_called", self._started)
        with self._lock:
            self._t0 = self._last_close = self._clock()
            self._call("on_fit_start", self._started)

    def on_progress(self, update: ProgressUpdate) -> None:
        """A [`ProgressUpdate`][torchspark.training.ProgressUpdate] listener: step 1, then step 2."""
        with self._lock:
            key = (update.rank, update.epoch)
            self._iters[key] = max(self._iters.get(key, 0), update.iteration)
            self._examples[key] = max(self._examples.get(key, 0), update.examples)
            sent, dense = self._traffic.get(key, (0, 0))
            self._traffic[key] = (max(sent, update.bytes_sent), max(dense, update.dense_bytes))
            self._epoch_scores[key] = update.score
            self._latest_score[update.rank] = update.score
            self._rank_epoch[update.rank] = max(self._rank_epoch.get(update.rank, 0), update.epoch)
            self._call("on_iteration", self._iteration_event(update.rank))
            self._close_ready()

    def on_score(self, report: ScoreReport) -> None:
        """A [`ScoreReport`][torchspark.training.ScoreReport] listener (the score every worker agrees on)."""
        with self._lock:
            self._reports.setdefault(report.epoch, []).append(report)
            self._close_ready()

    def end(self, network: Any, score: float, stats: Any = None, error: BaseException | None = None) -> None:
        """Close the remaining epochs (only after a successful fit) and emit [`FitEnded`][torchspark.listeners.FitEnded]."""
        with self._lock:
            if error is None:
                while self._next_epoch < self._started.epochs:
                    self._close_epoch()
            seconds = self._clock() - self._t0
            waits = [_end_wait(listener, calls) for listener, calls in zip(self.listeners, self._queues)]
            self._call(
                "on_fit_end",
                FitEnded(
                    network=network,
                    score=score,
                    seconds=seconds,
                    examples=self._total_examples(),
                    stats=stats,
                    error=error,
                ),
            )
            queues, self._queues = self._queues, [None] * len(self.listeners)
        started = time.monotonic()
        for listener, calls, wait in zip(self.listeners, queues, waits):  # in parallel: one deadline each
            if calls is not None:
                finished = calls.close(wait - (time.monotonic() - started))
                with contextlib.suppress(TypeError):  # an unhashable listener is not remembered
                    _ABANDONED.discard(listener) if finished else _ABANDONED.add(listener)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every listener handled the events emitted so far (at most ``timeout_s``); False if one had
        not. Events are delivered on the listeners' own threads: call it before reading what a listener
        recorded while the fit runs."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            queues = [q for q in self._queues if q is not None]
        return all([q.flush(max(deadline - time.monotonic(), 0.0)) for q in queues])

    # ------------------------------------------------------------------ internals
    def _call(self, method: str, event: Any) -> None:
        """Queue ``listener.method(event)`` on every listener's own thread (called under the lock: in order)."""
        for i, listener in enumerate(self.listeners):
            calls = self._queues[i]
            if calls is None:
                calls = self._queues[i] = CallQueue(f"torchspark-listener-{type(listener).__name__}", clock=self._clock)
            calls.submit(_deliver, listener, method, event)

    def _total_examples(self) -> int:
        return sum(self._examples.values())

    def _cumulative_traffic(self, through_epoch: int | None = None) -> tuple[int, int]:
        """Sharing traffic summed over workers: each worker's latest report (up to ``through_epoch``)."""
        latest: dict[int, tuple[int, int, int]] = {}
        for (rank, epoch), (sent, dense) in self._traffic.items():
            if through_epoch is not None and epoch > through_epoch:
                continue
            if rank not in latest or epoch >= latest[rank][0]:
                latest[rank] = (epoch, sent, dense)
        return sum(v[1] for v in latest.values()), sum(v[2] for v in latest.values())

    def _iteration_event(self, rank: int) -> IterationEvent:
        steps: dict[int, int] = {}
        for (r, _), n in self._iters.items():
            steps[r] = steps.get(r, 0) + n
        finite = [s for s in self._latest_score.values() if math.isfinite(s)]
        examples = self._total_examples()
        elapsed = max(self._clock() - self._t0, 1e-9)
        sent, dense = self._cumulative_traffic()
        return IterationEvent(
            iteration=self._started.start_iteration + max(steps.values(), default=0),
            epoch=self._started.start_epoch + self._rank_epoch.get(rank, 0),
            score=sum(finite) / len(finite) if finite else math.nan,
            examples=examples,
            examples_per_second=examples / elapsed,
            bytes_sent=sent,
            dense_bytes=dense,
            rank=rank,
        )

    def _ready(self, epoch: int) -> bool:
        if any(r.round is None for r in self._reports.get(epoch, ())):
            return True  # gradient sharing's epoch score: every worker finished the epoch
        n = self._started.num_workers or 0
        return n > 0 and all(self._rank_epoch.get(rank, -1) > epoch for rank in range(n))

    def _close_ready(self) -> None:
        while self._next_epoch < self._started.epochs and self._ready(self._next_epoch):
            self._close_epoch()

    def _close_epoch(self) -> None:
        e = self._next_epoch
        score, examples = self._epoch_score(e)
        now = self._clock()
        seconds = now - self._last_close
        cum = self._cumulative_traffic(through_epoch=e)
        self._call(
            "on_epoch_end",
            EpochEvent(
                epoch=self._started.start_epoch + e,
                score=score,
                examples=examples,
                seconds=seconds,
                examples_per_second=examples / seconds if seconds > 0 else math.nan,
                bytes_sent=max(cum[0] - self._last_cum[0], 0),
                dense_bytes=max(cum[1] - self._last_cum[1], 0),
            ),
        )
        self._next_epoch, self._last_close, self._last_cum = e + 1, now, cum

    def _epoch_score(self, epoch: int) -> tuple[float, int]:
        """The epoch's score and examples: from the workers' agreed scores when they sent any, else from their
        progress reports."""
        reports = self._reports.get(epoch, [])
        whole = [r for r in reports if r.round is None]
        if whole:
            return whole[-1].score, whole[-1].examples
        progress_examples = sum(n for (_, ep), n in self._examples.items() if ep == epoch)
        if reports:
            n = sum(r.examples for r in reports)
            score = sum(r.score * r.examples for r in reports) / n if n else math.nan
            return score, max(n, progress_examples)
        last = [s for (_, ep), s in self._epoch_scores.items() if ep == epoch and math.isfinite(s)]
        return (sum(last) / len(last) if last else math.nan), progress_examples
