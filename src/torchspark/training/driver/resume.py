"""The driver side of resuming: turn a fit's task into the task that continues from its run's newest checkpoint."""

from __future__ import annotations

import dataclasses
import logging

from torchspark.errors import ConfigError
from torchspark.nn import NetworkBlueprint
from torchspark.training.checkpoint import store
from torchspark.training.checkpoint.config import ResumePoint
from torchspark.training.task import WorkerTask

__all__ = ["resume_task", "find_resume_point"]

log = logging.getLogger(__name__)


def find_resume_point(task: WorkerTask) -> ResumePoint | None:
    """The newest complete checkpoint of ``task``'s run as a :class:`ResumePoint` (None: none, or the task does not
    checkpoint).

    Raises:
        ConfigError: the checkpoint belongs to a different fit (another algorithm, other algorithm settings, a
            network with another number of parameters) or to a run that already trained more epochs than asked.
    """
    plan = task.checkpoint
    if plan is None:
        return None
    found = store.newest_checkpoint(plan.directory, plan.run_id)
    if found is None:
        return None
    m = found.manifest
    where = f"run {plan.run_id!r} (checkpoint {found.path})"
    if m.get("mode") != task.mode:
        raise ConfigError(f"{where} was trained with {m.get('mode')!r}, this fit uses {task.mode!r}; use the same "
                          "training master to resume it, or a new run_id to start over")
    if m.get("settings") != task.settings:
        raise ConfigError(f"{where} was trained with the algorithm settings {m.get('settings')}, this fit has "
                          f"{task.settings}; resume with the same master options, or use a new run_id")
    if int(m["fit_epoch"]) > task.epochs:
        raise ConfigError(f"{where} has already trained {m['fit_epoch']} epochs of its fit, but this fit asks for "
                          f"epochs={task.epochs}; ask for at least {m['fit_epoch']} epochs (the same as the "
                          "interrupted fit continues it), or use a new run_id")
    return ResumePoint(run_id=plan.run_id, path=found.path, step=int(m["step"]), fit_epoch=int(m["fit_epoch"]),
                       world_size=int(m["world_size"]), iteration=int(m["iteration"]), epoch=int(m["epoch"]),
                       fit_start_iteration=int(m.get("fit_start_iteration", 0)),
                       fit_start_epoch=int(m.get("fit_start_epoch", 0)))


def resume_task(task: WorkerTask) -> tuple[WorkerTask, ResumePoint | None]:
    """The task to (re)start the workers with, and where it resumes.

    When ``task.checkpoint`` is set and its run (``checkpoint_directory/run_id``) has a complete checkpoint, the
    returned task carries the newest one: its blueprint holds the checkpoint's parameters, rank 0's updater state
    and buffers and the network counters, and ``task.resume`` tells every worker to restore its own rank file
    (updater state, buffers, residual and threshold state for sharing, its data position) and to skip the epochs and
    minibatches already done. Otherwise the task is returned unchanged with None.

    Call it before every launch of the workers: before the first (a fit with a ``run_id`` of an interrupted run
    continues it, even from a new driver process) and before each relaunch after a failure (the same run id, so the
    newest checkpoint of this very fit). Cheap when there is no checkpoint (one directory listing).

    Args:
        task: the fit's task as :func:`~torchspark.training.driver.fit.build_task` made it (any earlier ``resume`` is
            replaced).
    Returns:
        ``(task, point)``: ``point`` is None when the fit starts from ``task``'s own blueprint.
    Raises:
        ConfigError: the run's checkpoint does not fit this task (see :func:`find_resume_point`).
        SerializationError: the checkpoint's rank-0 file cannot be read.
    """
    base = dataclasses.replace(task, resume=None)
    point = find_resume_point(base)
    if point is None:
        return base, None
    tensors, meta = store.read_rank_file(point.path, 0)
    net = NetworkBlueprint.from_bytes(task.blueprint).build("cpu")
    if net.num_params() != tensors["params"].numel():
        raise ConfigError(f"run {point.run_id!r}: its checkpoint has {tensors['params'].numel()} parameters but this "
                          f"network has {net.num_params()}; resume with the same network, or use a new run_id")
    net.set_params(tensors["params"])
    net.set_updater_state(tensors["updater_state"])
    net.amp.load_state_tensors(tensors)
    net.load_buffer_state({k[len("buffer."):]: v for k, v in tensors.items() if k.startswith("buffer.")})
    net.iteration, net.epoch = int(meta["iteration"]), int(meta["epoch"])
    log.info("resuming run %s from %s: epoch %d of the fit, step %d", point.run_id, point.path, point.fit_epoch,
             point.step)
    # first_epoch: the per-epoch shuffle order is a function of the run's epochs, also from a new driver process
    return dataclasses.replace(base, blueprint=NetworkBlueprint.of(net).to_bytes(), resume=point,
                               first_epoch=point.fit_start_epoch), point
