"""What a fit checkpoints and where it resumes: two small frozen values carried by the
[`WorkerTask`][torchspark.training.WorkerTask].

* `CheckpointPlan` -- the fit's checkpoint options (directory, interval, how many to keep), its run id and
  the network counters at the start of the fit. Built by the driver from the training master
  (`plan_for`); every worker receives it and writes its part of each checkpoint.
* `ResumePoint` -- the checkpoint a (re)started fit continues from; built by
  `resume_task`.

The options themselves live on the masters (``checkpoint_directory``, ``checkpoint_every``, ``keep_checkpoints``) and
are validated once, by `check_options`.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from torchspark.errors import ConfigError
from torchspark.validation import check_int

__all__ = [
    "CheckpointPlan",
    "ResumePoint",
    "check_options",
    "check_run_id",
    "check_restart_epoch",
    "new_run_id",
    "plan_for",
    "DEFAULT_KEEP",
]

#: checkpoints kept per run by default: the newest, and one more in case the newest is being written when a fault
#: hits
DEFAULT_KEEP = 2

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_options(owner: str, directory: Any, every: Any, keep: Any) -> None:
    """Validate the checkpoint options of a master (``owner`` names it in messages).

    Raises:
        ConfigError: naming the bad value and what to pass instead.
    """
    if directory is not None and (not isinstance(directory, str) or not directory.strip()):
        raise ConfigError(
            f"{owner}: checkpoint_directory must be a directory path or fsspec URL (on a cluster: "
            f"shared storage such as hdfs://... or s3://...) or None, got {directory!r}"
        )
    check_int(
        "checkpoint_every",
        every,
        1,
        allow_none=True,
        owner=owner,
        none_means="once per epoch",
        meaning="(averaging rounds for parameter averaging, iterations for gradient sharing)",
    )
    check_int("keep_checkpoints", keep, 1, owner=owner, meaning="(the newest checkpoints kept per run)")
    if directory is None and every is not None:
        raise ConfigError(
            f"{owner}: checkpoint_every={every} needs a checkpoint_directory (where checkpoints go); "
            "set checkpoint_directory or leave checkpoint_every=None"
        )


def check_run_id(run_id: Any) -> str:
    """``run_id`` if it can name a directory on any storage, else ConfigError."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ConfigError(
            f"run_id must be 1-128 letters, digits, '.', '_' or '-' (starting with a letter or digit), got {run_id!r}"
        )
    return run_id


def check_restart_epoch(restart_epoch: Any, run_id: str | None) -> None:
    """ConfigError unless ``restart_epoch`` is a bool, and True only with a ``run_id`` (it applies to a resume)."""
    if not isinstance(restart_epoch, bool):
        raise ConfigError(f"restart_epoch must be True or False, got {restart_epoch!r}")
    if restart_epoch and run_id is None:
        raise ConfigError(
            "restart_epoch=True applies to a resumed run, but no run_id was given; pass the run_id of the run to "
            "resume, or leave restart_epoch=False"
        )


def new_run_id() -> str:
    """A fresh run id (UTC time + random suffix) for a fit that checkpoints without a user-given ``run_id``."""
    return time.strftime("fit-%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


@dataclass(frozen=True)
class CheckpointPlan:
    """The checkpoint side of one fit (every worker gets it inside the task).

    Args:
        directory: root of all runs' checkpoints (any fsspec URL); this fit's live under ``directory/run_id/``.
        run_id: names the run; a later fit with the same id continues from its newest checkpoint.
        every: averaging rounds (parameter averaging) or exchange iterations (gradient sharing) between checkpoints;
            None: at the end of every epoch. The end of the fit is always checkpointed.
        keep: newest complete checkpoints kept; older ones are deleted by rank 0 after each write.
        fit_start_iteration: the network's iteration counter when the fit (the first attempt) started.
        fit_start_epoch: the network's epoch counter when the fit started.
        master_json: the training master's JSON (written into each manifest, for the record).
        restart_epoch: a rank whose data no longer matches the position of the checkpoint it resumes from (a cut
            inside an epoch: another batch size, data size or order) trains that epoch again from its start instead
            of refusing the resume (``fit(..., restart_epoch=True)``).
    """

    directory: str
    run_id: str
    every: int | None = None
    keep: int = DEFAULT_KEEP
    fit_start_iteration: int = 0
    fit_start_epoch: int = 0
    master_json: str = "{}"
    restart_epoch: bool = False

    def __post_init__(self) -> None:
        check_options("CheckpointPlan", self.directory, self.every, self.keep)
        check_run_id(self.run_id)
        check_restart_epoch(self.restart_epoch, self.run_id)


@dataclass(frozen=True)
class ResumePoint:
    """Where a fit continues: the newest complete checkpoint of its run.

    Attributes:
        run_id: the run.
        path: the checkpoint's directory (fsspec URL); each worker reads its ``rank-<r>.safetensors`` there.
        step: the checkpoint's number: rounds (averaging) / exchange iterations (sharing) counted since the fit
            started; the interval counter continues from it.
        fit_epoch: epochs of this fit completed before the checkpoint; workers start in epoch ``fit_epoch`` of
            their data, after the minibatches their rank file says are done.
        world_size: workers that wrote it; a resumed fit must have as many.
        iteration: the network's (rank 0's) iteration counter at the checkpoint.
        epoch: the network's epoch counter at the checkpoint.
        fit_start_iteration: the counters when the fit started, so the driver advances them as one fit would.
        fit_start_epoch: see ``fit_start_iteration``.
    """

    run_id: str
    path: str
    step: int
    fit_epoch: int
    world_size: int
    iteration: int
    epoch: int
    fit_start_iteration: int = 0
    fit_start_epoch: int = 0


def plan_for(
    master: Any, run_id: str | None, iteration: int, epoch: int, restart_epoch: bool = False
) -> CheckpointPlan | None:
    """The fit's `CheckpointPlan` from a training master's options (None when it does not checkpoint).

    Raises:
        ConfigError: ``run_id`` without a ``checkpoint_directory`` on the master, or a malformed ``run_id``;
            ``restart_epoch`` not a bool, or True without a ``run_id``.
    """
    check_restart_epoch(restart_epoch, run_id)
    directory = getattr(master, "checkpoint_directory", None)
    if directory is None:
        if run_id is not None:
            raise ConfigError(
                f"fit(run_id={run_id!r}) resumes from checkpoints, but the training master has no "
                "checkpoint_directory; set checkpoint_directory=... (shared storage on a cluster) on "
                "the master (ParallelWrapper: the checkpoint_directory option)"
            )
        return None
    return CheckpointPlan(
        directory=directory,
        run_id=check_run_id(run_id) if run_id is not None else new_run_id(),
        every=master.checkpoint_every,
        keep=master.keep_checkpoints,
        fit_start_iteration=iteration,
        fit_start_epoch=epoch,
        master_json=master.to_json(),
        restart_epoch=restart_epoch,
    )
