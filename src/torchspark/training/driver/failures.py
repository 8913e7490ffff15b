"""How a worker's failure reaches the user, on every route (in-process threads, local processes, Spark tasks):
which worker's error is the cause (not a peer's reaction to it), the end of its traceback, and the error the driver
raises.

A worker's failure becomes a [`WorkerError`][torchspark.errors.WorkerError] carrying the end of its traceback
(`worker_failure`: ``worker 1 failed: ValueError: bad input`` then ``--- worker traceback ---``); when the
worker raised one of our errors (a ``DataError`` found mid-training) the error is that class too
(`worker_error_type`). The first error to arrive is often a peer's symptom ("Connection closed by peer"), so
the routes give the failing worker a moment to report its own (`wait_for_root_cause`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from torchspark import errors
from torchspark.errors import TorchSparkError, WorkerError
from torchspark.training.waiting import Deadline

__all__ = [
    "traceback_tail",
    "last_line",
    "is_peer_failure",
    "root_cause",
    "wait_for_root_cause",
    "worker_error_type",
    "worker_failure",
]


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


def wait_for_root_cause(
    errors: Callable[[], Sequence[tuple[int, str]]],
    wait_s: float,
    receive: Callable[[float], bool] | None = None,
    poll_s: float = 0.05,
) -> tuple[int, str] | None:
    """`root_cause` of ``errors()`` once one of them is a cause, or when ``wait_s`` has passed.

    Args:
        errors: the ``(rank, traceback)`` reports so far (re-read after every wait).
        wait_s: how long the failing worker gets to report its own error after a peer's symptom arrived.
        receive: waits up to the given seconds for more reports (e.g. reads a results queue into the list that
            ``errors`` returns) and returns False when no more can come (a worker died without a word); None:
            sleep, the reports arrive on another thread.
        poll_s: the longest single wait.
    Example: ``wait_for_root_cause(server.errors, 3.0)`` after Spark reported a peer's "Connection reset".
    """
    deadline = Deadline.after(wait_s)
    while not any(not is_peer_failure(tb) for _, tb in errors()) and not deadline.expired:
        left = deadline.left(cap=poll_s) or 0.0
        if receive is None:
            time.sleep(left)
        elif not receive(left):
            break
    return root_cause(errors())


def last_line(tb: str, default: str = "unknown error") -> str:
    """The last non-blank line of a traceback, stripped: the exception (``ValueError: bad input``); ``default``
    when there is none."""
    lines = [ln.strip() for ln in tb.splitlines() if ln.strip()]
    return lines[-1] if lines else default


def worker_failure(rank: int, tb: str) -> WorkerError:
    """The error the driver raises for worker ``rank`` that failed with traceback ``tb``: its last line, then the
    end of the traceback, as `worker_error_type`'s class.

    Example: ``raise worker_failure(1, tb)`` -> ``WorkerError: worker 1 failed: ValueError: bad input`` followed
    by ``--- worker traceback ---`` and the traceback's last 20 lines.
    """
    return worker_error_type(tb)(
        f"worker {rank} failed: {last_line(tb)}\n--- worker traceback ---\n{traceback_tail(tb)}"
    )


def traceback_tail(tb: str, max_lines: int = 20) -> str:
    """The last lines of a traceback, keeping its ``Traceback (most recent call last):`` header."""
    lines = [ln for ln in tb.strip().splitlines() if not ln.strip().startswith("SQLSTATE")]
    if len(lines) <= max_lines:
        return "\n".join(lines)
    return "\n".join(["Traceback (most recent call last):", "  ...", *lines[-(max_lines - 2) :]])


_MIXED: dict[type, type[WorkerError]] = {}


def worker_error_type(tb: str) -> type[WorkerError]:
    """The class of the error the driver raises for a worker that failed with traceback ``tb``.

    [`WorkerError`][torchspark.errors.WorkerError], or, when the worker raised one of our errors ``X`` (``DataError``, ``ConfigError``...), a
    subclass of both (``WorkerDataError``), so ``except DataError`` catches bad data whether the driver or a worker
    found it, and ``except WorkerError`` still catches every worker failure.
    """
    match = _OUR_ERROR.match(last_line(tb, ""))
    cls = getattr(errors, match.group(1), None) if match else None
    if (
        not isinstance(cls, type)
        or not issubclass(cls, TorchSparkError)
        or issubclass(cls, WorkerError)
        or issubclass(WorkerError, cls)
    ):  # WorkerError already is a TrainingError, a TorchSparkError
        return WorkerError
    if cls not in _MIXED:
        try:
            _MIXED[cls] = type(
                f"Worker{cls.__name__}",
                (WorkerError, cls),
                {"__module__": errors.__name__, "__doc__": f"A worker raised {cls.__name__}."},
            )
        except TypeError:  # a base whose instance layout cannot mix with RuntimeError's (TimeoutError)
            _MIXED[cls] = WorkerError
    return _MIXED[cls]
