"""The exceptions torchspark raises.

Every error names the bad value and says what to change. Catch [`TorchSparkError`][torchspark.cli.TorchSparkError] to catch them all.
"""

from __future__ import annotations

__all__ = [
    "TorchSparkError",
    "ConfigError",
    "DataError",
    "TrainingError",
    "EncodingError",
    "SerializationError",
    "SetupError",
    "WorkerError",
    "WorkerLost",
    "WaitTimeout",
    "PeerLost",
]


class TorchSparkError(Exception):
    """Base class of every torchspark error."""


class ConfigError(TorchSparkError, ValueError):
    """A configuration value is invalid (bad option, unknown name, out-of-range knob)."""


class DataError(TorchSparkError, ValueError):
    """Training or evaluation data is malformed: shapes, labels, NaN/Inf, empty data, bad batch files."""


class TrainingError(TorchSparkError, RuntimeError):
    """Training went wrong at run time: NaN loss, diverged replicas, a failed worker."""


class EncodingError(TorchSparkError, ValueError):
    """An encoded update could not be decoded: foreign, truncated or of an unknown version."""


class SerializationError(TorchSparkError, ValueError):
    """A saved model could not be written or read (missing files, pickle not allowed, unknown spec)."""


class SetupError(TorchSparkError, RuntimeError):
    """The environment cannot run the job: no Java, too few Spark task slots, workers cannot import torch."""


class WorkerError(TrainingError):
    """A worker raised; the message carries the last lines of the worker's traceback."""


class WorkerLost(WorkerError):
    """A worker, its process or its executor was lost (killed, out of memory, a hung peer), not a bug in the user's
    code or data: the failure automatic recovery (``max_failures``) retries.

    Attributes:
        rank: the lost worker's rank (None when it is not known).
        executor: Spark's executor id or the worker process's name (None when not known).
        exit_status: ``"signal SIGKILL"``, ``"exit code 137"``... (None when not known).
        reason: the runner's or Spark's own words for what happened.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        executor: str | None = None,
        exit_status: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.executor = executor
        self.exit_status = exit_status
        self.reason = reason


class WaitTimeout(TorchSparkError, TimeoutError):
    """A blocking wait ran out of time; the message names the knob that sets the timeout."""


class PeerLost(WaitTimeout):
    """A peer worker exited or failed while this one waited for it: a symptom of the peer's failure, not a cause.

    Runners recognise it by name in a worker's traceback and show the failing peer's own error instead.
    """
