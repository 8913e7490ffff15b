"""How a worker's failure reaches the user, on every route: which worker's error is the cause (not a peer's
reaction to it), the end of its traceback, and the error class the driver raises.

A worker's failure becomes a :class:`~torchspark.errors.WorkerError` carrying the end of its traceback; when the
worker raised one of our errors (a ``DataError`` found mid-training) the error is that class too
(:func:`worker_error_type`).
"""

from __future__ import annotations

import re
from typing import Sequence

from torchspark import errors
from torchspark.errors import TorchSparkError, WorkerError

__all__ = ["traceback_tail", "is_peer_failure", "root_cause", "worker_error_type"]


# What a worker sees when a *peer* died or was aborted: secondary failures, never the cause.
_PEER_FAILURE = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|BrokenBarrier|transport/tcp|"
    r"NCCL (?:error|communicator was aborted)|ProcessGroup.*abort|peer (?:left|failed|aborted)|"
    r"rendezvous_timeout_s|barrier\(\) timed out|TaskKilled|was killed|cancelled|aborted|PeerLost",
    re.I,
)


_OUR_ERROR = re.compile(r"^torchspark\.errors\.(\w+): ")


def is_peer_failure(tb: str) -> bool:
    """True when a worker's traceback says a peer went away (the symptom), not what went wrong (the cause)."""
    return bool(_PEER_FAILURE.search(tb))


def root_cause(errors: Sequence[tuple[int, str]]) -> tuple[int, str] | None:
    """The error to show the user: the first that is not a peer's reaction to another worker's failure."""
    if not errors:
        return None
    for rank, tb in errors:
        if not is_peer_failure(tb):
            return rank, tb
    return errors[0]


def traceback_tail(tb: str, max_lines: int = 20) -> str:
    """The last lines of a traceback, keeping its ``Traceback (most recent call last):`` header."""
    lines = [ln for ln in tb.strip().splitlines() if not ln.strip().startswith("SQLSTATE")]
    if len(lines) <= max_lines:
        return "\n".join(lines)
    return "\n".join(["Traceback (most recent call last):", "  ...", *lines[-(max_lines - 2):]])


_MIXED: dict[type, type[WorkerError]] = {}


def worker_error_type(tb: str) -> type[WorkerError]:
    """The class of the error the driver raises for a worker that failed with traceback ``tb``.

    :class:`WorkerError`, or, when the worker raised one of our errors ``X`` (``DataError``, ``ConfigError``...), a
    subclass of both (``WorkerDataError``), so ``except DataError`` catches bad data whether the driver or a worker
    found it, and ``except WorkerError`` still catches every worker failure.
    """
    lines = [ln.strip() for ln in tb.strip().splitlines() if ln.strip()]
    match = _OUR_ERROR.match(lines[-1]) if lines else None
    cls = getattr(errors, match.group(1), None) if match else None
    if not isinstance(cls, type) or not issubclass(cls, TorchSparkError) or issubclass(cls, WorkerError) \
            or issubclass(WorkerError, cls):  # WorkerError already is a TrainingError, a TorchSparkError
        return WorkerError
    if cls not in _MIXED:
        try:
            _MIXED[cls] = type(f"Worker{cls.__name__}", (WorkerError, cls),
                               {"__module__": errors.__name__, "__doc__": f"A worker raised {cls.__name__}."})
        except TypeError:  # a base whose instance layout cannot mix with RuntimeError's (TimeoutError)
            _MIXED[cls] = WorkerError
    return _MIXED[cls]
