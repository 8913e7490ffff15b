"""Recording phases, scores and encoding stats in one process (a worker task or the driver).

The hot path is one ``time.perf_counter()`` pair and one ``list.append`` of a tuple per phase: appends are atomic
under the GIL, so several threads (e.g. a prefetch thread and the training loop) can record without a lock.
[`StatsCollector.drain`][torchspark.stats.StatsCollector.drain] turns the records into a compact column-wise *payload* (numpy arrays plus name tables)
that travels to the driver in a task result and is merged with [`TrainingStats.add_worker_payload`][torchspark.stats.TrainingStats.add_worker_payload].

Payload layout (``PAYLOAD_FORMAT``)::

    {"format": "torchspark.stats/1", "worker": str, "clock_offset": float,
     "phases":   {"names": [str], "code": int32[n], "start": float64[n], "duration": float64[n],
                  "attrs": {key: float64[n] (NaN = absent)}},
     "scores":   {"iteration": int64[m], "score": float64[m]},
     "encoding": {"step": int64[k], "bytes_sent": int64[k], "dense_bytes": int64[k], "sparsity": float64[k],
                  "threshold": float64[k], "format_names": [str], "format": int32[k]}}

Starts in a payload are already on the driver's clock (the collector's ``clock_offset`` has been subtracted).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from torchspark.errors import DataError
from torchspark.stats.events import DRIVER_ID, PAYLOAD_FORMAT, Phase, phase_name

__all__ = ["StatsCollector"]


class _PhaseTimer:
    """Context manager returned by [`StatsCollector.phase`][torchspark.stats.StatsCollector.phase]; yields its mutable attribute dict."""

    __slots__ = ("_collector", "_name", "_attrs", "_t0")

    def __init__(self, collector: StatsCollector, name: str, attrs: dict[str, Any]) -> None:
        self._collector = collector
        self._name = name
        self._attrs = attrs
        self._t0 = 0.0

    def __enter__(self) -> dict[str, Any]:
        self._t0 = time.perf_counter()
        return self._attrs

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t1 = time.perf_counter()
        c = self._collector
        if c.enabled:
            if exc_type is not None:
                self._attrs["failed"] = 1
            start = c._wall0 + (self._t0 - c._perf0) - c.clock_offset
            c._events.append((self._name, start, t1 - self._t0, self._attrs or None))


class StatsCollector:
    """Collects timed phases, the score series and encoding stats of one worker (or of the driver).

    Args:
        worker_id: who recorded the events, e.g. ``"driver"`` or ``"worker-3"``; it names the timeline row.
        clock_offset: this process's clock minus the driver's clock in seconds (see
            [`torchspark.stats.clock.clock_offset`][torchspark.stats.clock_offset]); subtracted from every start time. Leave 0.0 on the driver
            and when the offset is applied later by ``TrainingStats.add_worker_payload(..., clock_offset=...)``
            (apply it in exactly one of the two places).
        enabled: False makes every call a cheap no-op (stats collection off).

    Start times come from ``time.perf_counter()`` anchored to ``time.time()`` once at construction, so they are
    monotonic and precise within the process, and on the driver's time axis across processes.
    """

    def __init__(self, worker_id: str = DRIVER_ID, *, clock_offset: float = 0.0, enabled: bool = True) -> None:
        if not isinstance(worker_id, str) or not worker_id:
            raise DataError(f"worker_id must be a non-empty string such as 'worker-0', got {worker_id!r}")
        self.worker_id = worker_id
        self.clock_offset = float(clock_offset)
        self.enabled = bool(enabled)
        self._wall0 = time.time()
        self._perf0 = time.perf_counter()
        self._events: list[tuple[str, float, float, dict[str, Any] | None]] = []
        self._scores: list[tuple[int, float]] = []
        self._encoding: list[tuple[int, int, int, float, float, str]] = []
        self._drain_lock = threading.Lock()  # only drain/snapshot take it, never the recording calls

    # ---- recording ----------------------------------------------------------------------------------------------

    def now(self) -> float:
        """Current time on the driver's clock (seconds since the epoch)."""
        return self._wall0 + (time.perf_counter() - self._perf0) - self.clock_offset

    def phase(self, name: str | Phase, **attrs: Any) -> _PhaseTimer:
        """Time a block as one phase event.

        Use as ``with collector.phase("fit", examples=32) as attrs: ...``; ``attrs`` is the attribute dict and may
        be filled inside the block (``attrs["examples"] = n`` when the count is known only afterwards). Attribute
        values must be numbers. A block that raises is still recorded, with ``failed=1``.
        """
        return _PhaseTimer(self, phase_name(name), attrs)

    def record_phase(self, name: str | Phase, duration: float, *, start: float | None = None, **attrs: Any) -> None:
        """Record a phase timed elsewhere.

        Args:
            name: phase name.
            duration: seconds (>= 0).
            start: this process's wall clock (``time.time()``) at the start; default: now minus ``duration``.
            **attrs: numeric attributes (``examples=32``, ``iteration=7``).

        Raises:
            DataError: negative or non-finite duration.
        """
        if not self.enabled:
            return
        duration = float(duration)
        if not (duration >= 0.0 and np.isfinite(duration)):
            raise DataError(f"phase {phase_name(name)!r} duration must be a finite number >= 0, got {duration!r}")
        local_start = time.time() - duration if start is None else float(start)
        self._events.append((phase_name(name), local_start - self.clock_offset, duration, attrs or None))

    def record_score(self, iteration: int, score: float) -> None:
        """Record the score (loss) of this worker at ``iteration``."""
        if self.enabled:
            self._scores.append((int(iteration), float(score)))

    def record_encoding(
        self, step: int, bytes_sent: int, dense_bytes: int, sparsity: float, threshold: float, format: str
    ) -> None:  # noqa: A002 - the field is called format everywhere else
        """Record one gradient-sharing encode step.

        Args:
            step: iteration of the step.
            bytes_sent: wire size of the encoded message.
            dense_bytes: size the dense update would have had (4 bytes per float32 element).
            sparsity: fraction of entries sent (``entries / N``).
            threshold: the encoding threshold used.
            format: message format name (``"sparse"``, ``"bitmap"``, ``"empty"``).
        """
        if self.enabled:
            self._encoding.append(
                (int(step), int(bytes_sent), int(dense_bytes), float(sparsity), float(threshold), str(format))
            )

    def __len__(self) -> int:
        """Number of phase events recorded and not yet drained."""
        return len(self._events)

    # ---- shipping -----------------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The payload of everything recorded so far, keeping the records (see the module docstring for the layout)."""
        with self._drain_lock:
            return self._payload(list(self._events), list(self._scores), list(self._encoding))

    def drain(self) -> dict[str, Any]:
        """The payload of everything recorded so far, and forget it (ship once per task or round)."""
        with self._drain_lock:
            # Swapping each list is atomic; a record racing with the swap lands in the new list, never lost.
            events, self._events = self._events, []
            scores, self._scores = self._scores, []
            encoding, self._encoding = self._encoding, []
            return self._payload(events, scores, encoding)

    def _payload(
        self,
        events: list[tuple[str, float, float, dict[str, Any] | None]],
        scores: list[tuple[int, float]],
        encoding: list[tuple[int, int, int, float, float, str]],
    ) -> dict[str, Any]:
        return {
            "format": PAYLOAD_FORMAT,
            "worker": self.worker_id,
            "clock_offset": self.clock_offset,
            "phases": _phase_columns(events),
            "scores": {
                "iteration": np.array([s[0] for s in scores], dtype=np.int64),
                "score": np.array([s[1] for s in scores], dtype=np.float64),
            },
            "encoding": _encoding_columns(encoding),
        }


def _phase_columns(events: list[tuple[str, float, float, dict[str, Any] | None]]) -> dict[str, Any]:
    names: dict[str, int] = {}
    codes = np.array([names.setdefault(e[0], len(names)) for e in events], dtype=np.int32)
    attrs: dict[str, np.ndarray] = {}
    for i, e in enumerate(events):
        if e[3] is None:
            continue
        for key, value in e[3].items():
            column = attrs.get(key)
            if column is None:
                column = attrs[key] = np.full(len(events), np.nan)
            try:
                column[i] = float(value)
            except (TypeError, ValueError) as err:
                raise DataError(
                    f"phase {e[0]!r} attribute {key}={value!r} is not a number; stats attributes must "
                    "be numeric (put labels in the phase name instead)"
                ) from err
    return {
        "names": list(names),
        "code": codes,
        "start": np.array([e[1] for e in events], dtype=np.float64),
        "duration": np.array([e[2] for e in events], dtype=np.float64),
        "attrs": attrs,
    }


def _encoding_columns(rows: list[tuple[int, int, int, float, float, str]]) -> dict[str, Any]:
    formats: dict[str, int] = {}
    return {
        "step": np.array([r[0] for r in rows], dtype=np.int64),
        "bytes_sent": np.array([r[1] for r in rows], dtype=np.int64),
        "dense_bytes": np.array([r[2] for r in rows], dtype=np.int64),
        "sparsity": np.array([r[3] for r in rows], dtype=np.float64),
        "threshold": np.array([r[4] for r in rows], dtype=np.float64),
        "format": np.array([formats.setdefault(r[5], len(formats)) for r in rows], dtype=np.int32),
        "format_names": list(formats),
    }
