"""The driver side of resuming: turn a fit's task into the task that continues from its run's newest usable
checkpoint, and open the run for a fit (`open_run`: its lock, checked before any worker starts).

What is trusted of a checkpoint (`torchspark.training.checkpoint.trust`): every count of its manifest and rank
files is bounded and consistent, its files are this user's alone (local storage), its parameters are finite, and
it was written by the same fit: the same algorithm and settings, the same network (updater, learning rate, losses,
regularisation, precision) and the same data order (``rng_seed``, ``accumulate_steps``, ``drop_last``,
``batch_size_per_worker`` of the master). A damaged checkpoint is skipped with a warning naming it, and the resume
falls back to the previous complete one; when every checkpoint of the run is damaged the fit is refused (never a
silent fresh start that would prune them). A checkpoint of another fit is refused with a
[`ConfigError`][torchspark._io.ConfigError] saying what differs, and so is a checkpoint whose manifest names another
``run_id`` (copied or moved into this run's directory): resuming it would continue another run under this name.
Whether the data still matches a checkpoint cut inside an epoch is the workers' to check, on the minibatches they
skip (`torchspark.training.checkpoint.position`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import torch

from torchspark.errors import ConfigError, SerializationError
from torchspark.nn import NetworkBlueprint
from torchspark.training.checkpoint import store
from torchspark.training.checkpoint.config import CheckpointPlan, ResumePoint
from torchspark.training.checkpoint.lock import RunLock, acquire_run_lock
from torchspark.training.checkpoint.trust import FIX, CheckpointDamaged, check_run_directory, problem
from torchspark.training.task import WorkerTask

__all__ = ["resume_task", "find_resume_point", "open_run", "NETWORK_KEYS", "DATA_ORDER_KEYS"]

log = logging.getLogger(__name__)

#: the network settings a resumed fit must share with its checkpoint (the blueprint's JSON config)
NETWORK_KEYS = ("updater", "loss", "weight_decay", "l1", "gradient_clip", "precision", "num_params")
#: the master's options that shape which examples each minibatch holds and in which order
DATA_ORDER_KEYS = ("rng_seed", "shuffle_scope", "accumulate_steps", "drop_last", "batch_size_per_worker")


def open_run(plan: CheckpointPlan | None, in_process: bool) -> RunLock | None:
    """Check a checkpointing fit's storage before any worker starts, and take its run's lock.

    Args:
        plan: the fit's checkpoint plan (None: the fit does not checkpoint; nothing to do).
        in_process: the workers run as threads of this process (``InProcessRunner``); ``memory://`` storage is
            only shared then.
    Returns:
        The lock to release when the fit ends (None without a plan).
    Raises:
        ConfigError: ``memory://`` with workers in other processes; a checkpoint directory that cannot be created
            or written (read-only, a file in the way); a run directory another user owns; another live fit of the
            same run (`acquire_run_lock`).
    """
    if plan is None:
        return None
    if plan.directory.startswith("memory://") and not in_process:
        raise ConfigError(
            f"checkpoint_directory={plan.directory!r}: memory:// storage lives inside one process, "
            "but this fit's workers run in their own processes (each would write to its own copy); "
            "use a directory on disk or shared storage (hdfs://, s3://...)"
        )
    check_run_directory(store.run_directory(plan.directory, plan.run_id))
    return acquire_run_lock(plan.directory, plan.run_id)


def _differences(saved: dict[str, Any], now: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    return [f"{k}: {saved.get(k)!r} then, {now.get(k)!r} now" for k in keys if saved.get(k) != now.get(k)]


def _check_same_fit(task: WorkerTask, plan: CheckpointPlan, m: dict[str, Any], where: str) -> None:
    """ConfigError when checkpoint manifest ``m`` was written by another fit than ``task``'s."""
    if m.get("run_id") != plan.run_id:  # copied or moved here from another run's directory
        raise ConfigError(
            f"{where} was written by run {m.get('run_id')!r}, not by run {plan.run_id!r}: it was copied or moved "
            "into this run's directory, and a resume would continue another run's training under this name. "
            f"Resume that run with run_id={m.get('run_id')!r} from its own directory, or remove the checkpoint "
            f"from {store.run_directory(plan.directory, plan.run_id)!r} (or use a new run_id) to start this run"
        )
    if m.get("mode") != task.mode:
        raise ConfigError(
            f"{where} was trained with {m.get('mode')!r}, this fit uses {task.mode!r}; use the same "
            "training master to resume it, or a new run_id to start over"
        )
    if m.get("settings") != task.settings:
        raise ConfigError(
            f"{where} was trained with the algorithm settings {m.get('settings')}, this fit has "
            f"{task.settings}; resume with the same master options, or use a new run_id"
        )
    network = NetworkBlueprint.from_bytes(task.blueprint).config
    changed = _differences(m.get("network") or {}, network, NETWORK_KEYS) if m.get("network") else []
    master = m.get("master")
    if isinstance(master, dict):
        changed += _differences(master, json.loads(plan.master_json), DATA_ORDER_KEYS)
    if changed:
        raise ConfigError(
            f"{where} was written by a fit with other settings ({'; '.join(changed)}); a resume must "
            "train as the interrupted fit would have (the same network, updater, learning rate and "
            "data order): resume with the settings it had, or use a new run_id to start a new run"
        )
    if m["fit_epoch"] > task.epochs:
        raise ConfigError(
            f"{where} has already trained {m['fit_epoch']} epochs of its fit, but this fit asks for "
            f"epochs={task.epochs}; ask for at least {m['fit_epoch']} epochs (the same as the "
            "interrupted fit continues it), or use a new run_id"
        )


def _point(plan: CheckpointPlan, found: store.StoredCheckpoint) -> ResumePoint:
    m = found.manifest
    return ResumePoint(
        run_id=plan.run_id,
        path=found.path,
        step=m["step"],
        fit_epoch=m["fit_epoch"],
        world_size=m["world_size"],
        iteration=m["iteration"],
        epoch=m["epoch"],
        fit_start_iteration=int(m.get("fit_start_iteration", 0)),
        fit_start_epoch=int(m.get("fit_start_epoch", 0)),
    )


def _candidates(task: WorkerTask) -> list[tuple[ResumePoint, bytes] | str]:
    """Newest first, each usable checkpoint as ``(point, blueprint)`` until the first one, and each damaged one
    before it as its error message (the caller warns or refuses)."""
    plan = task.checkpoint
    assert plan is not None
    damaged: list[tuple[ResumePoint, bytes] | str] = []
    for step, path in reversed(store.step_directories(plan.directory, plan.run_id)):
        try:
            found = store.load_checkpoint(step, path)
            if found is None:
                continue  # incomplete: a writer was stopped before the manifest
            _check_same_fit(task, plan, found.manifest, f"run {plan.run_id!r} (checkpoint {found.path})")
            point = _point(plan, found)
            return [*damaged, (point, _blueprint(task, point))]
        except CheckpointDamaged as e:
            log.warning("%s", e)
            damaged.append(problem(e))
    return damaged


def find_resume_point(task: WorkerTask) -> ResumePoint | None:
    """The newest usable checkpoint of ``task``'s run as a `ResumePoint` (None: none, or the task does not
    checkpoint).

    Raises:
        ConfigError: the checkpoint belongs to a different fit (another algorithm, other algorithm settings, another
            network, updater or learning rate, another data order), to another run (its manifest's ``run_id``), or
            to a run that already trained more epochs than asked.
        SerializationError: every checkpoint of the run is damaged (the message names each).
    """
    found = _resolve(dataclasses.replace(task, resume=None))
    return None if found is None else found[0]


def _resolve(task: WorkerTask) -> tuple[ResumePoint, bytes] | None:
    if task.checkpoint is None:
        return None
    found = _candidates(task)
    if found and not isinstance(found[-1], str):
        return found[-1]
    if found:
        raise SerializationError(
            f"run {task.checkpoint.run_id!r} has checkpoints but none is usable: {' | '.join(map(str, found))}. "
            f"Starting afresh would discard them, so the fit is refused: delete "
            f"{store.run_directory(task.checkpoint.directory, task.checkpoint.run_id)!r} to start the run anew, "
            "or use a new run_id"
        )
    return None


def _blueprint(task: WorkerTask, point: ResumePoint) -> bytes:
    """The task's blueprint with checkpoint ``point``'s rank-0 state (parameters, updater state, buffers,
    counters).

    Raises:
        CheckpointDamaged: the rank-0 file cannot be read or holds non-finite parameters.
        ConfigError: its parameter count differs from the network's.
    """
    tensors, meta = store.read_rank_file(point.path, 0)
    net = NetworkBlueprint.from_bytes(task.blueprint).build("cpu")
    params = tensors.get("params")
    if params is None or "updater_state" not in tensors:
        raise CheckpointDamaged(f"{store.rank_file(point.path, 0)!r} has no parameters or updater state; {FIX}")
    if net.num_params() != params.numel():
        raise ConfigError(
            f"run {point.run_id!r}: its checkpoint has {params.numel()} parameters but this "
            f"network has {net.num_params()}; resume with the same network, or use a new run_id"
        )
    bad = int((~torch.isfinite(params)).sum())
    if bad:
        raise CheckpointDamaged(
            f"{store.rank_file(point.path, 0)!r} holds {bad} non-finite (NaN/inf) parameters "
            f"and cannot be resumed from; {FIX}"
        )
    net.set_params(params)
    net.set_updater_state(tensors["updater_state"])
    net.amp.load_state_tensors(tensors)
    net.load_buffer_state({k[len("buffer.") :]: v for k, v in tensors.items() if k.startswith("buffer.")})
    net.iteration, net.epoch = int(meta["iteration"]), int(meta["epoch"])
    return NetworkBlueprint.of(net).to_bytes()


def resume_task(task: WorkerTask) -> tuple[WorkerTask, ResumePoint | None]:
    """The task to (re)start the workers with, and where it resumes.

    When ``task.checkpoint`` is set and its run (``checkpoint_directory/run_id``) has a usable checkpoint, the
    returned task carries the newest one: its blueprint holds the checkpoint's parameters, rank 0's updater state
    and buffers and the network counters, and ``task.resume`` tells every worker to restore its own rank file
    (updater state, buffers, residual and threshold state for sharing, random streams, its data position) and to
    skip the epochs and minibatches already done. Otherwise the task is returned unchanged with None.

    Call it before every launch of the workers: before the first (a fit with a ``run_id`` of an interrupted run
    continues it, even from a new driver process) and before each relaunch after a failure (the same run id, so the
    newest checkpoint of this very fit). Cheap when there is no checkpoint (one directory listing).

    Args:
        task: the fit's task as `build_task` made it (any earlier ``resume`` is
            replaced).
    Returns:
        ``(task, point)``: ``point`` is None when the fit starts from ``task``'s own blueprint.
    Raises:
        ConfigError: the run's checkpoint does not fit this task (see `find_resume_point`).
        SerializationError: every checkpoint of the run is damaged.
    """
    base = dataclasses.replace(task, resume=None)
    found = _resolve(base)
    if found is None:
        return base, None
    point, blueprint = found
    log.info(
        "resuming run %s from %s: epoch %d of the fit, step %d", point.run_id, point.path, point.fit_epoch, point.step
    )
    # first_epoch: the per-epoch shuffle order is a function of the run's epochs, also from a new driver process
    return dataclasses.replace(base, blueprint=blueprint, resume=point, first_epoch=point.fit_start_epoch), point
