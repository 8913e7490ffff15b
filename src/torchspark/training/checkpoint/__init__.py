"""Checkpoints of a fit and resuming from them (see `store` for the layout, `writer` for when and what
each worker writes; the driver's side of resuming is `torchspark.training.driver.resume`).

Options (on both training masters and ``ParallelWrapper``): ``checkpoint_directory`` (any fsspec URL; on a cluster
shared storage), ``checkpoint_every`` (averaging rounds / sharing iterations; default: once per epoch) and
``keep_checkpoints`` (default 2). ``fit(..., run_id="r1")`` continues run ``r1`` from its newest checkpoint.
What a resume trusts of a checkpoint is `trust`'s to check; one fit per run at a time holds `lock`.
"""

from torchspark.training.checkpoint.config import (
    DEFAULT_KEEP,
    CheckpointPlan,
    ResumePoint,
    check_options,
    check_restart_epoch,
    check_run_id,
    new_run_id,
    plan_for,
)
from torchspark.training.checkpoint.lock import RunLock, acquire_run_lock
from torchspark.training.checkpoint.store import StoredCheckpoint, complete_checkpoints, newest_checkpoint
from torchspark.training.checkpoint.trust import CheckpointDamaged
from torchspark.training.checkpoint.writer import (
    CheckpointWriter,
    RankProgress,
    RestoredRank,
    check_position,
    restore_rank,
)

__all__ = [
    "DEFAULT_KEEP",
    "CheckpointPlan",
    "ResumePoint",
    "check_options",
    "check_run_id",
    "check_restart_epoch",
    "new_run_id",
    "plan_for",
    "StoredCheckpoint",
    "complete_checkpoints",
    "newest_checkpoint",
    "CheckpointWriter",
    "RankProgress",
    "RestoredRank",
    "check_position",
    "restore_rank",
    "CheckpointDamaged",
    "RunLock",
    "acquire_run_lock",
]
