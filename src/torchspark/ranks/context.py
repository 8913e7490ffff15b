"""The calls a training function makes inside [`run`][torchspark.launch.run]: `report`, `get_checkpoint`,
`get_context` (Ray Train's names; they work the same on every route: local processes, classic Spark, Spark Connect).

Each rank of a run has one `TrainContext` (set by `run_rank` for the function's duration, in the rank's own
process). Outside a run the three calls raise a [`SetupError`][torchspark.errors.SetupError] naming the fix.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchspark.errors import ConfigError, SetupError
from torchspark.ranks.checkpoints import check_checkpoint, load_newest, newest_step, save_checkpoint
from torchspark.ranks.shares import DataShare
from torchspark.training.hooks import ProgressUpdate

__all__ = ["TrainContext", "report", "get_checkpoint", "get_context", "current", "activate"]


@dataclass
class TrainContext:
    """Where this rank runs and what the run gives it (``get_context()`` inside the function).

    Attributes:
        rank: this rank (``RANK``), 0 to ``world_size - 1``.
        world_size: the ranks of this attempt (``WORLD_SIZE``).
        local_rank: ``LOCAL_RANK`` as set in the environment (on Spark: the CUDA index of the task's GPU, 0 on
            the CPU; on one machine: the rank).
        attempt: which launch of the ranks this is (0 first; each recovery from a lost worker adds one).
        backend: the ``torch.distributed`` backend that fits the rank's device: ``"nccl"`` on a GPU, else
            ``"gloo"``.
        device: the rank's torch device (``"cpu"``, ``"cuda:0"``...).
        run_id: the run's id (names its checkpoints).
        checkpoint_dir: where reported checkpoints go (None: the run keeps none).
        seed: the run's seed (``run(seed=...)``): `data` shuffles with ``seed + epoch``.
    """

    rank: int
    world_size: int
    local_rank: int = 0
    attempt: int = 0
    backend: str = "gloo"
    device: str = "cpu"
    run_id: str = ""
    checkpoint_dir: str | None = None
    seed: int = 0
    share: DataShare | None = field(default=None, repr=False)
    progress: Any = field(default=None, repr=False)
    reports: int = 0
    last_metrics: dict[str, Any] = field(default_factory=dict, repr=False)
    _next_step: int | None = field(default=None, repr=False)

    def data(
        self, epoch: int = 0, batch_size: int = 32, columns: Sequence[str] | None = None, shuffle: bool = True
    ) -> Iterator[dict[str, Any]]:
        """This rank's share of ``run(..., data=...)``, one epoch of it: dicts of column -> tensor, ``batch_size``
        rows each (the last one shorter), in an order drawn from ``seed + epoch`` (``shuffle=False``: as stored).
        Read from the rank's local copy (Arrow, memory-mapped); call it once per epoch.

        Raises:
            ConfigError: the run was given no ``data``.
        """
        if self.share is None:
            raise ConfigError(
                "get_context().data() but run() was given no data; pass run(fn, ..., data=df) (a Spark DataFrame, a "
                "pyarrow Table or a pandas DataFrame on one machine)"
            )
        return self.share.batches(self.seed + epoch, batch_size, columns, shuffle)


_current: TrainContext | None = None


def activate(ctx: TrainContext | None) -> None:
    """Make ``ctx`` this process's rank context (None: leave the run)."""
    global _current
    _current = ctx


def current(what: str) -> TrainContext:
    """The rank's context, for the call ``what``.

    Raises:
        SetupError: outside a run.
    """
    if _current is None:
        raise SetupError(
            f"{what} was called outside torchspark.launch.run: it only works inside the training function that "
            "run(fn, ...) runs on every rank; call it from there (or remove it when the function runs on its own)"
        )
    return _current


def _score(metrics: Mapping[str, Any]) -> float:
    for key in ("loss", "score"):
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    first = next((v for v in metrics.values() if isinstance(v, (int, float)) and not isinstance(v, bool)), None)
    return float("nan") if first is None else float(first)


def _count(metrics: Mapping[str, Any], key: str) -> int:
    value = metrics.get(key, 0)
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else 0


def report(metrics: Mapping[str, Any], checkpoint: Any = None) -> None:
    """Report this rank's ``metrics`` (and, on rank 0, a ``checkpoint``) to the driver.

    The metrics drive the live progress bar and the progress listeners: ``loss`` (else ``score``, else the first
    number) is the update's score, ``epoch`` and ``examples`` (counts, optional) its epoch and examples; each call
    is one iteration. A ``checkpoint`` (a state dict of tensors, or a directory the function wrote) reported by rank
    0 is written to the run's ``checkpoint_dir`` (safetensors, atomic, checksummed); after a lost worker the ranks
    restart with ``get_checkpoint()`` returning the newest one. Other ranks' checkpoints are checked, not stored.

    Raises:
        SetupError: called outside ``run``.
        ConfigError: ``metrics`` is not a mapping of names, ``checkpoint`` is neither a state dict nor a
            directory, or a checkpoint was reported by a run without ``checkpoint_dir``.
    """
    ctx = current("report()")
    if not isinstance(metrics, Mapping) or not all(isinstance(k, str) for k in metrics):
        raise ConfigError(
            f"report() got metrics of type {type(metrics).__name__}; pass a dict of names to numbers, "
            'e.g. report({"loss": loss.item(), "epoch": epoch})'
        )
    ctx.reports += 1
    ctx.last_metrics = dict(metrics)
    if checkpoint is not None:
        check_checkpoint(checkpoint)
        if ctx.checkpoint_dir is None:
            raise ConfigError(
                "report(checkpoint=...) but the run has nowhere to keep checkpoints; pass run(..., "
                "checkpoint_dir=...) (on a cluster a directory every executor and the driver reach)"
            )
        if ctx.rank == 0:
            if ctx._next_step is None:
                ctx._next_step = newest_step(ctx.checkpoint_dir, ctx.run_id) + 1
            save_checkpoint(ctx.checkpoint_dir, ctx.run_id, ctx._next_step, checkpoint, metrics, ctx.reports)
            ctx._next_step += 1
    if ctx.progress is not None:
        ctx.progress(
            ProgressUpdate(
                ctx.rank, _count(metrics, "epoch"), ctx.reports, _count(metrics, "examples"), _score(metrics)
            )
        )


def get_checkpoint() -> Any:
    """The run's newest checkpoint, verified: the state dict rank 0 reported, or the path of a fresh local
    directory holding the files of a directory checkpoint; None on a fresh run (no checkpoint reported yet).

    Raises:
        SetupError: called outside ``run``.
    """
    ctx = current("get_checkpoint()")
    if ctx.checkpoint_dir is None:
        return None
    found = load_newest(ctx.checkpoint_dir, ctx.run_id)
    return None if found is None else found[0]


def get_context() -> TrainContext:
    """This rank's `TrainContext` (rank, world size, attempt, device, its data).

    Raises:
        SetupError: called outside ``run``.
    """
    return current("get_context()")
