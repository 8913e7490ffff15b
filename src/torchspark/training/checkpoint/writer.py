"""The worker side of checkpoints: when to write (:class:`CheckpointWriter`) and how a rank restores its state
(:func:`restore_rank`).

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
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from torchspark._io import read_safetensors_metadata
from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.training.checkpoint import store
from torchspark.training.checkpoint.config import CheckpointPlan, ResumePoint

__all__ = ["CheckpointWriter", "RankProgress", "restore_rank"]

log = logging.getLogger(__name__)


@dataclass
class RankProgress:
    """One rank's running totals for the fit (what its :class:`~torchspark.training.task.WorkerResult` reports),
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
        step: the step counter to continue from (a resumed fit's :attr:`ResumePoint.step`).
    """

    def __init__(self, plan: CheckpointPlan, rank: int, world_size: int, mode: str, settings: dict[str, Any],
                 blueprint: bytes, step: int = 0) -> None:
        self.plan = plan
        self.rank = rank
        self.world_size = world_size
        self.mode = mode
        self.settings = settings
        self.step = step
        self._network_config = json.loads(read_safetensors_metadata(blueprint)["config"]) if rank == 0 else {}
        #: seconds spent writing (this rank), for the stats and the overhead benchmark
        self.seconds = 0.0
        self.written = 0

    def round_end(self, net: Network, fit_epoch: int, done: int, progress: RankProgress,
                  algo_tensors: dict[str, torch.Tensor], algo_meta: dict[str, Any]) -> None:
        """A round (averaging) / exchange (sharing) inside an epoch ended: write when the interval says so."""
        self.step += 1
        if self.plan.every is not None and self.step % self.plan.every == 0:
            self.write(net, fit_epoch, done, progress, algo_tensors, algo_meta)

    def epoch_end(self, net: Network, next_fit_epoch: int, last: bool, progress: RankProgress,
                  algo_tensors: dict[str, torch.Tensor], algo_meta: dict[str, Any]) -> None:
        """An epoch ended (``net.epoch`` already advanced): write once per epoch by default, on the interval
        otherwise, and always at the end of the fit (``last``), so a finished run resumes as finished."""
        self.step += 1
        due = self.plan.every is None or self.step % self.plan.every == 0 or last
        if due:
            self.write(net, next_fit_epoch, 0, progress, algo_tensors, algo_meta)

    def write(self, net: Network, fit_epoch: int, done: int, progress: RankProgress,
              algo_tensors: dict[str, torch.Tensor], algo_meta: dict[str, Any]) -> None:
        """Write this rank's file of checkpoint ``self.step`` (rank 0: then the manifest, then prune)."""
        start = time.perf_counter()
        path = store.step_directory(self.plan.directory, self.plan.run_id, self.step)
        tensors: dict[str, torch.Tensor] = {"updater_state": net.updater_state(), **net.amp.state_tensors()}
        tensors.update({f"buffer.{k}": v for k, v in net.buffer_state().items()})
        tensors.update({f"algo.{k}": v for k, v in algo_tensors.items()})
        if self.rank == 0:
            tensors["params"] = net.params()
        meta = {"rank": self.rank, "step": self.step, "fit_epoch": fit_epoch, "done": done,
                "iteration": net.iteration, "epoch": net.epoch, "examples": progress.examples,
                "iterations": progress.iterations, "score": None if math.isnan(progress.score) else progress.score,
                "algo": algo_meta}
        store.write_rank_file(path, self.rank, tensors, meta)
        if self.rank == 0:
            store.write_manifest(path, {
                "run_id": self.plan.run_id, "step": self.step, "fit_epoch": fit_epoch, "world_size": self.world_size,
                "iteration": net.iteration, "epoch": net.epoch, "num_params": net.num_params(), "mode": self.mode,
                "settings": self.settings, "fit_start_iteration": self.plan.fit_start_iteration,
                "fit_start_epoch": self.plan.fit_start_epoch, "master": json.loads(self.plan.master_json),
                "network": self._network_config, "written_at": time.time(),
                "files": [f"rank-{r}.safetensors" for r in range(self.world_size)]})
            store.prune(self.plan.directory, self.plan.run_id, self.plan.keep)
        self.seconds += time.perf_counter() - start
        self.written += 1
        log.debug("rank %d wrote checkpoint step %d of run %s (epoch %d, %d minibatches done)", self.rank,
                  self.step, self.plan.run_id, fit_epoch, done)


    def close(self) -> None:
        """End of the fit (called after a collective, so every rank's files are written): rank 0 prunes once more,
        since a peer still writing its file of the newest checkpoint made it incomplete when rank 0 last pruned."""
        if self.rank == 0 and self.written:
            store.prune(self.plan.directory, self.plan.run_id, self.plan.keep)


def restore_rank(point: ResumePoint, rank: int, world_size: int, net: Network
                 ) -> tuple[int, RankProgress, dict[str, torch.Tensor], dict[str, Any]]:
    """Restore this rank's network state from checkpoint ``point``; returns ``(done, progress, algorithm tensors,
    algorithm record)``: the minibatches of epoch ``point.fit_epoch`` already consumed, the fit's totals so far,
    and the algorithm's part for ``algorithm.restore``.

    The parameters come with the task's blueprint (rank 0's, equal on all ranks at the cut); this sets the rank's
    own updater state (and fp16's scaler state), buffers and counters.

    Raises:
        ConfigError: the checkpoint was written by a different number of workers.
    """
    if point.world_size != world_size:
        raise ConfigError(f"run {point.run_id!r}: its checkpoint {point.path} was written by {point.world_size} "
                          f"workers but this fit has {world_size}; resume with {point.world_size} workers "
                          "(num_workers / ParallelWrapper workers) or start a new run_id")
    tensors, meta = store.read_rank_file(point.path, rank)
    net.set_updater_state(tensors["updater_state"])
    net.amp.load_state_tensors(tensors)
    buffers = {k[len("buffer."):]: v for k, v in tensors.items() if k.startswith("buffer.")}
    if buffers:
        net.load_buffer_state(buffers)
    net.iteration = int(meta["iteration"])
    net.epoch = int(meta["epoch"])
    score = meta.get("score")
    progress = RankProgress(int(meta["examples"]), int(meta["iterations"]), math.nan if score is None else score)
    algo = {k[len("algo."):]: v for k, v in tensors.items() if k.startswith("algo.")}
    return int(meta["done"]), progress, algo, dict(meta.get("algo") or {})
