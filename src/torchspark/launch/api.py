"""`run`: your own training function on every rank of a ``torch.distributed`` world, on Spark (a barrier stage of
a classic or Spark Connect session) or on this machine (processes), with TorchDistributor's contract and the
masters' recovery, progress and checkpoints.

The attempt loop is the masters' (`torchspark.training.driver.recovery`): attempt 0 first; a lost worker
([`WorkerLost`][torchspark.errors.WorkerLost]: a killed process or executor, a hung rank the watchdog stopped)
starts the next attempt while ``max_failures`` allows, with the function restarting from the newest checkpoint
it reported (``get_checkpoint()``); the same hang twice, or a failure more than ``max_failures``, ends the run;
a rank's own error is never retried and comes back with its traceback as a
[`WorkerError`][torchspark.errors.WorkerError]. Each attempt has its own progress server (the driver's
`FitContext`), which feeds the progress bar and the listeners.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchspark.errors import ConfigError, WorkerLost
from torchspark.ranks.body import ship_function
from torchspark.training.checkpoint import check_run_id, new_run_id
from torchspark.training.driver.context import FitContext
from torchspark.training.driver.recovery import (
    Decision,
    FailureRecord,
    decide,
    exhausted_error,
    hang_error,
    record_failure,
    repeated_hang,
)
from torchspark.training.hooks import NullRecorder, ProgressUpdate
from torchspark.training.progress import ProgressBar
from torchspark.validation import check_int

__all__ = ["run", "RunOutcome", "Distributor", "TorchDistributor"]

log = logging.getLogger(__name__)

#: the rendezvous/collective and silent-rank timeout when none is given (the masters' default)
DEFAULT_TIMEOUT_S = 300.0
#: how long a finished attempt waits for the ranks' last progress messages
_DRAIN_S = 5.0


@dataclass
class RunOutcome:
    """What the last `run` on this thread went through (``last_outcome()``): its failed attempts."""

    failures: list[FailureRecord] = field(default_factory=list)
    attempts: int = 0


_last = RunOutcome()


def last_outcome() -> RunOutcome:
    """The failed attempts and the attempt count of the last `run` in this process."""
    return _last


def _launcher(spark: Any, local_mode: bool | None, use_gpu: bool, data: Any) -> Any:
    if local_mode is None:
        local_mode = spark is None and not _is_spark_frame(data)
    if local_mode:
        if spark is not None:
            raise ConfigError("run(spark=..., local_mode=True): pass one of them (local_mode runs on this machine)")
        from torchspark.launch.local import LocalLauncher

        return LocalLauncher(use_gpu, data)
    from torchspark.spark.launch import SparkLauncher, active_session, check_data

    check_data(data)
    session = spark if spark is not None else active_session()
    if session is None:
        raise ConfigError(
            "run(local_mode=False) found no Spark session; pass run(..., spark=session), start one first, or use "
            "local_mode=True to run the ranks as processes of this machine"
        )
    return SparkLauncher(session, use_gpu, data)


def _is_spark_frame(data: Any) -> bool:
    if data is None or type(data).__module__.split(".")[0] != "pyspark":
        return False
    from torchspark.spark.launch import is_spark_frame

    return is_spark_frame(data)


def run(
    fn: Callable[..., Any],
    *args: Any,
    num_workers: int = 1,
    use_gpu: bool = False,
    spark: Any = None,
    local_mode: bool | None = None,
    data: Any = None,
    kwargs: dict[str, Any] | None = None,
    max_failures: int = 0,
    min_workers: int | None = None,
    checkpoint_dir: str | None = None,
    run_id: str | None = None,
    seed: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    stall_timeout_s: float | None = None,
    progress: bool | None = None,
    listeners: Sequence[Callable[[ProgressUpdate], None]] = (),
    description: str = "torchspark run",
) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``num_workers`` ranks and return rank 0's return value.

    Every rank runs with the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``), so ``torch.distributed.init_process_group("gloo")`` (``"nccl"`` on GPUs) in
    ``fn`` just works. Inside ``fn``: [`report`][torchspark.ranks.report],
    [`get_checkpoint`][torchspark.ranks.get_checkpoint], [`get_context`][torchspark.ranks.get_context].

    Args:
        fn: the training function (shipped with cloudpickle, as Spark ships tasks).
        *args: its positional arguments; ``kwargs``: its keyword arguments.
        num_workers: the ranks.
        use_gpu: a GPU per rank: on Spark through its resource scheduling (the session's
            ``spark.task.resource.gpu.amount``, else a stage-level profile of one GPU per task), on one machine
            ``cuda:<rank>``.
        spark: the Spark session (classic or Connect) to run on; None: the active session when ``local_mode`` is
            False or ``data`` is a Spark DataFrame, else this machine.
        local_mode: True: processes of this machine; False: a Spark barrier stage; None: decided as ``spark``
            says.
        data: what the ranks share: a Spark DataFrame (each rank reads its partition, streamed, never collected
            on the driver), or on one machine a pyarrow Table / pandas DataFrame; read it in ``fn`` with
            ``get_context().data(epoch, batch_size)``.
        max_failures: lost workers the run recovers from (0: none), each time relaunching every rank with ``fn``
            restarting from the newest reported checkpoint.
        min_workers: a relaunch may run with fewer ranks, down to this many, when the cluster lost slots (None:
            always ``num_workers``).
        checkpoint_dir: where ``report(checkpoint=...)`` keeps checkpoints (on a cluster a directory every
            executor and the driver reach); None: on one machine a temporary directory, on Spark none.
        run_id: names the run's checkpoints; an existing run continues from its newest one (None: a fresh id).
        seed: shuffles ``data`` (``seed + epoch``).
        timeout_s: how long a silent rank (no heartbeat) or the rendezvous may take.
        stall_timeout_s: the masters' stall watchdog: an attempt in which no rank reports for this long is a hang
            (None: off).
        progress: draw a progress bar (None: when stderr is a terminal).
        listeners: progress listeners, called with every ``report``'s update on the driver.
        description: names the run's Spark jobs and its messages.
    Raises:
        SerializationError: ``fn`` or its arguments cannot be pickled (before anything starts).
        SetupError: ``num_workers`` above the cluster's free task slots (before the stage starts).
        WorkerError: a rank raised (its traceback; never retried), or the run lost workers more than
            ``max_failures`` times ([`WorkerLost`][torchspark.errors.WorkerLost]).
    """
    global _last
    check_int("num_workers", num_workers, 1)
    check_int("max_failures", max_failures, 0)
    if min_workers is not None:
        check_int("min_workers", min_workers, 1)
        if min_workers > num_workers:
            raise ConfigError(f"min_workers={min_workers} is above num_workers={num_workers}; lower min_workers")
    if run_id is not None:
        check_run_id(run_id)
    blob = ship_function(fn, tuple(args), dict(kwargs or {}))
    launcher = _launcher(spark, local_mode, use_gpu, data)
    launcher.check_slots(min_workers if min_workers is not None else num_workers)
    if num_workers > (min_workers or num_workers):
        workers = max(min_workers or 1, min(num_workers, launcher.capacity()))
    else:
        workers = num_workers
    scratch = None
    if checkpoint_dir is None and type(launcher).__name__ == "LocalLauncher":
        scratch = tempfile.TemporaryDirectory(prefix="torchspark-checkpoints-")
        checkpoint_dir = scratch.name
    run_id = run_id or new_run_id()
    outcome = _last = RunOutcome()
    bar = ProgressBar(desc=description, enabled=progress)
    try:
        attempt = 0
        while True:
            outcome.attempts = attempt + 1
            context = FitContext(
                None,  # type: ignore[arg-type]  # no Network: run() trains the user's own model
                NullRecorder(),
                description,
                [*listeners, bar.update],
                attempt=attempt,
                stall_timeout_s=stall_timeout_s,
            )
            started = time.time()
            ok = False
            try:
                value = launcher.launch(
                    blob,
                    workers,
                    attempt=attempt,
                    run_id=run_id,
                    checkpoint_dir=checkpoint_dir,
                    seed=seed,
                    timeout_s=timeout_s,
                    context=context,
                )
                ok = True
                return value
            except WorkerLost as error:
                outcome.failures.append(
                    record_failure(error, attempt, started, context.reached(), context.worker_pids(), context.suspect())
                )
                if repeated_hang(outcome.failures):
                    raise hang_error(outcome.failures, error) from error
                if decide(error, len(outcome.failures), max_failures) is Decision.EXHAUSTED:
                    raise exhausted_error(outcome.failures, max_failures, error) from error
                log.warning(
                    "%s; relaunching every rank from the newest checkpoint (attempt %d, failure %d of at most %d)",
                    outcome.failures[-1].describe(),
                    attempt + 1,
                    len(outcome.failures),
                    max_failures,
                )
                if min_workers is not None:
                    workers = max(min_workers, min(num_workers, launcher.capacity()))
                attempt += 1
            finally:
                context.close(drain_s=_DRAIN_S if ok else 0.0, succeeded=ok)
    finally:
        bar.close()
        if scratch is not None:
            scratch.cleanup()


class Distributor:
    """``run`` as an object, for code that configures once and runs many functions.

    Example: ``Distributor(num_workers=2).run(train, lr=0.1)`` is ``run(train, num_workers=2, kwargs={"lr": 0.1})``.
    Every keyword of `run` except ``kwargs`` is an argument here.
    """

    def __init__(self, num_workers: int = 1, **options: Any) -> None:
        if "kwargs" in options:
            raise ConfigError("Distributor(kwargs=...): pass the function's keyword arguments to .run(fn, **kwargs)")
        self.options = {"num_workers": num_workers, **options}

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on every rank; rank 0's return value."""
        return run(fn, *args, kwargs=kwargs, **self.options)


class TorchDistributor(Distributor):
    """A drop-in for ``pyspark.ml.torch.distributor.TorchDistributor``: the same arguments and defaults
    (``num_processes=1, local_mode=True, use_gpu=True``), ``.run(fn, *args, **kwargs)`` returning rank 0's value;
    a script moves over by changing its import. Extra keywords (``max_failures``, ``checkpoint_dir``, ``data``...)
    are `run`'s. A string ``train_object`` (a script path) is not supported: pass the function.
    """

    def __init__(
        self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True, spark: Any = None, **options: Any
    ) -> None:
        super().__init__(num_processes, local_mode=local_mode, use_gpu=use_gpu, spark=spark, **options)

    def run(self, train_object: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """``train_object(*args, **kwargs)`` on every rank; rank 0's return value (TorchDistributor's names)."""
        if isinstance(train_object, str):
            raise ConfigError(
                f"TorchDistributor.run({train_object!r}): torchspark runs functions, not script files; import the "
                "script's training function and pass it"
            )
        return super().run(train_object, *args, **kwargs)
