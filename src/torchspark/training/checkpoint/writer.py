"""The worker side of checkpoints: when to write (`CheckpointWriter`) and how a rank restores its state
(`restore_rank`).

A checkpoint is taken at a *consistent cut*: a point every worker reaches after the same collective, where no
update is half-applied.

* Parameter averaging: right after a round's average (every worker holds the same parameters, updater state and
  floating-point buffers); the round that ends an epoch is checkpointed as "epoch done".
* Gradient sharing: after an exchange was applied. With ``overlap=True`` the next step's encoded message is
  already computed but not yet exchanged: it is saved with the rank's state (``algo.pending``) and a resumed fit
  exchanges it first, so the resumed fit applies exactly the same sequence of sums.

Each rank writes what is its own: its updater state (with fp16's gradient-scaler state) and buffers (local during a gradient-sharing fit), its
iteration counter, the algorithm's state (residual, threshold state), and its **data position**: the epoch of the
fit and how many minibatches of that epoch's order it has consumed (``done``). On resume a worker starts in that
epoch and skips its first ``done`` items of ``source.epoch(fit_epoch)`` -- whatever order that epoch has (a seeded
per-epoch shuffle included), so the position composes with any data order that is a function of the epoch index.
Rank 0 also writes the parameters (identical on all ranks at the cut) and the manifest.

Each rank also saves its random streams (torch's CPU generator, the CUDA generator of its device, numpy's and
Python's global ones: tensors and JSON, never pickle) and restores them on resume, so dropout and any other random
layer draw after a resume exactly what the uninterrupted fit drew. A mid-epoch cut also records how many minibatches
the rank's epoch has (``epoch_length``): a resume whose data gives that epoch another count (another batch size or
dataset) is refused, since skipping ``done`` of them would skip or repeat examples; and it records a fingerprint of
the ``done`` minibatches themselves (`position`), which the resume checks against the minibatches it skips, so
another batch size, data size or order is refused on every route, also where the epoch's length is not known up
front.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from torchspark._io import read_safetensors_metadata
from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.training.checkpoint import store
from torchspark.training.checkpoint.config import CheckpointPlan, ResumePoint
from torchspark.training.checkpoint.position import Position

__all__ = ["CheckpointWriter", "RankProgress", "RestoredRank", "restore_rank", "check_position"]

log = logging.getLogger(__name__)


@dataclass
class RankProgress:
    """One rank's running totals for the fit (what its [`WorkerResult`][torchspark.training.WorkerResult] reports),
    restored on resume so a resumed fit reports what one uninterrupted fit would."""

    examples: int = 0
    iterations: int = 0
    score: float = math.nan


class CheckpointWriter:
    """Decides when this rank writes its part of a checkpoint and writes it.

    Args:
        plan: the fit's checkpoint options and run id.
        rank: this worker's rank; rank 0 also writes the parameters and the manifest and prunes.
        world_size: workers in the fit.
        mode: the algorithm (written to the manifest; a resume with another algorithm is refused).
        settings: the algorithm's settings (likewise).
        blueprint: the task's network blueprint (its JSON config goes into the manifest).
        step: the step counter to continue from (a resumed fit's `ResumePoint.step`).
        barrier: waits until every rank called it (a tiny collective with the communicator's timeout); with it the
            ranks commit each checkpoint together (all files, then the manifest), so a checkpoint is complete or
            absent when any rank trains on. None: no commit (one worker, or tests of the writer alone).
    """

    def __init__(
        self,
        plan: CheckpointPlan,
        rank: int,
        world_size: int,
        mode: str,
        settings: dict[str, Any],
        blueprint: bytes,
        step: int = 0,
        barrier: Callable[[], None] | None = None,
    ) -> None:
        self.plan = plan
        self.barrier = barrier
        self.rank = rank
        self.world_size = world_size
        self.mode = mode
        self.settings = settings
        self.step = step
        self._network_config = json.loads(read_safetensors_metadata(blueprint)["config"]) if rank == 0 else {}
        #: seconds spent writing (this rank), for the stats and the overhead benchmark
        self.seconds = 0.0
        self.written = 0

    def round_end(
        self,
        net: Network,
        fit_epoch: int,
        done: int,
        progress: RankProgress,
        algo_tensors: dict[str, torch.Tensor],
        algo_meta: dict[str, Any],
        epoch_length: int | None = None,
        position: Position | None = None,
    ) -> None:
        """A round (averaging) / exchange (sharing) inside an epoch ended: write when the interval says so
        (``epoch_length``: the minibatches of this rank's epoch, when its source knows them; ``position``: the
        fingerprint of the ``done`` minibatches)."""
        self.step += 1
        if self.plan.every is not None and self.step % self.plan.every == 0:
            self.write(net, fit_epoch, done, progress, algo_tensors, algo_meta, epoch_length, position)

    def epoch_end(
        self,
        net: Network,
        next_fit_epoch: int,
        last: bool,
        progress: RankProgress,
        algo_tensors: dict[str, torch.Tensor],
        algo_meta: dict[str, Any],
    ) -> None:
        """An epoch ended (``net.epoch`` already advanced): write once per epoch by default, on the interval
        otherwise, and always at the end of the fit (``last``), so a finished run resumes as finished."""
        self.step += 1
        due = self.plan.every is None or self.step % self.plan.every == 0 or last
        if due:
            self.write(net, next_fit_epoch, 0, progress, algo_tensors, algo_meta)

    def write(
        self,
        net: Network,
        fit_epoch: int,
        done: int,
        progress: RankProgress,
        algo_tensors: dict[str, torch.Tensor],
        algo_meta: dict[str, Any],
        epoch_length: int | None = None,
        position: Position | None = None,
    ) -> None:
        """Write this rank's file of checkpoint ``self.step``; then (all ranks meet) rank 0 writes the manifest,
        (all meet again) and prunes."""
        start = time.perf_counter()
        path = store.step_directory(self.plan.directory, self.plan.run_id, self.step)
        tensors: dict[str, torch.Tensor] = {"updater_state": net.updater_state(), **net.amp.state_tensors()}
        tensors.update({f"buffer.{k}": v for k, v in net.buffer_state().items()})
        tensors.update({f"algo.{k}": v for k, v in algo_tensors.items()})
        if self.rank == 0:
            tensors["params"] = net.params()
        rng_tensors, rng_meta = _rng_state(net.device)
        tensors.update(rng_tensors)
        meta = {
            "rank": self.rank,
            "step": self.step,
            "fit_epoch": fit_epoch,
            "done": done,
            "iteration": net.iteration,
            "epoch": net.epoch,
            "examples": progress.examples,
            "iterations": progress.iterations,
            "score": None if math.isnan(progress.score) else progress.score,
            "algo": algo_meta,
            "rng": rng_meta,
            "epoch_length": epoch_length,
            "position": None if position is None or not done else position.to_json(),
        }
        store.write_rank_file(path, self.rank, tensors, meta)
        if self.barrier is not None:  # 1. every rank's file is written before the manifest makes it count
            self.barrier()
        if self.rank == 0:
            store.write_manifest(
                path,
                {
                    "run_id": self.plan.run_id,
                    "step": self.step,
                    "fit_epoch": fit_epoch,
                    "world_size": self.world_size,
                    "iteration": net.iteration,
                    "epoch": net.epoch,
                    "num_params": net.num_params(),
                    "mode": self.mode,
                    "settings": self.settings,
                    "fit_start_iteration": self.plan.fit_start_iteration,
                    "fit_start_epoch": self.plan.fit_start_epoch,
                    "master": json.loads(self.plan.master_json),
                    "network": self._network_config,
                    "written_at": time.time(),
                    "files": [f"rank-{r}.safetensors" for r in range(self.world_size)],
                },
            )
        if self.barrier is not None:  # 2. nobody trains on (or fails) before the checkpoint is complete
            self.barrier()
        if self.rank == 0:
            store.prune(self.plan.directory, self.plan.run_id, self.plan.keep)
        self.seconds += time.perf_counter() - start
        self.written += 1
        log.debug(
            "rank %d wrote checkpoint step %d of run %s (epoch %d, %d minibatches done)",
            self.rank,
            self.step,
            self.plan.run_id,
            fit_epoch,
            done,
        )

    def close(self) -> None:
        """End of the fit (called after a collective, so every rank's files are written): rank 0 prunes once more,
        since a peer still writing its file of the newest checkpoint made it incomplete when rank 0 last pruned."""
        if self.rank == 0 and self.written:
            store.prune(self.plan.directory, self.plan.run_id, self.plan.keep)


def _rng_state(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This process's random streams: torch's (CPU, and the device's CUDA generator) as tensors, numpy's and
    Python's as JSON."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if device.type == "cuda":
        tensors["rng.cuda"] = torch.cuda.get_rng_state(device)
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    version, state, gauss_next = random.getstate()
    meta = {"numpy": [str(kind), int(pos), int(has_gauss), float(gauss)], "python": [version, list(state), gauss_next]}
    return tensors, meta


def _set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any], device: torch.device) -> None:
    """Restore what `_rng_state` saved (a checkpoint without it, from an older version: left alone)."""
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"].to(torch.uint8))
    if "rng.cuda" in tensors and device.type == "cuda":
        torch.cuda.set_rng_state(tensors["rng.cuda"].to(torch.uint8), device)
    saved = meta.get("rng") or {}
    if "rng.numpy" in tensors and saved.get("numpy"):
        kind, pos, has_gauss, gauss = saved["numpy"]
        np.random.set_state((kind, tensors["rng.numpy"].numpy().astype(np.uint32), pos, has_gauss, gauss))
    if saved.get("python"):
        version, state, gauss_next = saved["python"]
        random.setstate((version, tuple(state), gauss_next))


@dataclass
class RestoredRank:
    """What `restore_rank` read of this rank's file besides the network's state.

    Attributes:
        done: minibatches of epoch ``ResumePoint.fit_epoch`` already consumed (skipped on resume).
        progress: the fit's totals so far.
        algo_tensors: the algorithm's tensors for ``algorithm.restore``.
        algo_meta: the algorithm's record.
        epoch_length: the minibatches the rank's epoch had when the checkpoint was cut (None: not recorded).
        where: the rank file, for messages.
        position: the fingerprint of the ``done`` minibatches (None: not recorded: an older version, or a
            checkpoint re-sharded for another number of workers).
    """

    done: int
    progress: RankProgress
    algo_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    algo_meta: dict[str, Any] = field(default_factory=dict)
    epoch_length: int | None = None
    where: str = ""
    position: Position | None = None


def check_position(restored: RestoredRank, epoch: int, length: int | None) -> None:
    """Refuse a resume whose data no longer matches the checkpoint's position: ``done`` past the end of the epoch,
    or (a cut inside the epoch) another number of minibatches than the rank had when the checkpoint was cut.

    Args:
        restored: this rank's record.
        epoch: the fit's epoch it resumes in.
        length: the minibatches this rank's epoch has now (None: its source cannot tell; nothing to compare).
    Raises:
        ConfigError: naming the file, the counts and the fix.
    """
    if length is None or not restored.done:
        return
    if restored.epoch_length not in (None, length) or restored.done > length:
        had = "" if restored.epoch_length is None else f" of the {restored.epoch_length} it had then"
        raise ConfigError(
            f"{restored.where}: the checkpoint was cut after {restored.done} minibatches{had} in epoch "
            f"{epoch}, but this fit gives the rank {length} minibatches in that epoch: the data or the "
            "batch size changed (resuming would skip or repeat examples), or the file is damaged; "
            "resume with the same data and batch_size, or start a new run_id"
        )


def restore_rank(point: ResumePoint, rank: int, world_size: int, net: Network) -> RestoredRank:
    """Restore this rank's network state and random streams from checkpoint ``point``; returns the rest of its
    record (`RestoredRank`): the data position, the fit's totals so far, the algorithm's part.

    The parameters come with the task's blueprint (rank 0's, equal on all ranks at the cut); this sets the rank's
    own updater state (and fp16's scaler state), buffers, counters and random streams.

    Raises:
        ConfigError: the checkpoint was written by a different number of workers.
        CheckpointDamaged: the rank's file cannot be read.
    """
    if point.world_size != world_size:
        raise ConfigError(
            f"run {point.run_id!r}: its checkpoint {point.path} was written by {point.world_size} "
            f"workers but this fit has {world_size}; resume with {point.world_size} workers "
            "(num_workers / ParallelWrapper workers) or start a new run_id"
        )
    tensors, meta = store.read_rank_file(point.path, rank)
    net.set_updater_state(tensors["updater_state"])
    net.amp.load_state_tensors(tensors)
    buffers = {k[len("buffer.") :]: v for k, v in tensors.items() if k.startswith("buffer.")}
    if buffers:
        net.load_buffer_state(buffers)
    net.iteration = int(meta["iteration"])
    net.epoch = int(meta["epoch"])
    _set_rng_state(tensors, meta, net.device)
    score = meta.get("score")
    progress = RankProgress(int(meta["examples"]), int(meta["iterations"]), math.nan if score is None else score)
    algo = {k[len("algo.") :]: v for k, v in tensors.items() if k.startswith("algo.")}
    length = meta.get("epoch_length")
    return RestoredRank(
        int(meta["done"]),
        progress,
        algo,
        dict(meta.get("algo") or {}),
        length if isinstance(length, int) else None,
        repr(store.rank_file(point.path, rank)),
        Position.from_json(meta.get("position")),
    )
