"""The driver's state of an ``averaging_via="spark"`` fit between rounds: the per-worker totals (`Tally`) and
its checkpoints (`RoundsCheckpoints`).

On this route the fit's whole state lives in the driver's network between rounds (every round starts from the
broadcast average), so the driver alone writes each checkpoint, as one "rank" with the parameters, the updater state,
the buffers and the totals, in the layout of `torchspark.training.checkpoint` (``world_size`` 1, ``done``
counting the rounds of the epoch). Once per epoch by default, every ``checkpoint_every`` rounds otherwise; a retry
after a lost executor (``max_failures``) or a later fit with the same ``run_id`` then continues from the newest
checkpoint: its epoch, its round, its totals. Resuming with another number of workers or rounds per epoch is
refused (the rounds would cover other minibatches).

Example: ``ParameterAveragingTrainingMaster(averaging_via="spark", checkpoint_directory="hdfs:///ckpt")``, then
``SparkNetwork(spark, net, master).fit(rdd, epochs=10, run_id="r1")``.
"""

from __future__ import annotations

import math
from typing import Any

from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.training.checkpoint import CheckpointWriter, RankProgress
from torchspark.training.checkpoint.store import read_rank_file
from torchspark.training.hooks import PhaseRecorder, ProgressUpdate
from torchspark.training.task import WorkerResult, WorkerTask

__all__ = ["Tally", "RoundsCheckpoints"]


class RoundsCheckpoints:
    """Checkpoints of a rounds fit, written by the driver (no-ops when the task does not checkpoint).

    Args:
        task: the attempt's task (``task.resume``: the checkpoint it continues).
        workers: the fit's workers (partitions).
        rounds: averaging rounds per epoch.
    """

    def __init__(self, task: WorkerTask, workers: int, rounds: int) -> None:
        self.task, self.workers, self.rounds = task, workers, rounds
        self.writer = (
            None
            if task.checkpoint is None
            else CheckpointWriter(
                task.checkpoint,
                0,
                1,
                task.mode,
                task.settings,
                task.blueprint,
                step=task.resume.step if task.resume is not None else 0,
            )
        )

    def start(self, network: Network, tally: Tally) -> tuple[int, int]:
        """``(epoch, round)`` the fit starts at; on resume, the checkpoint's state set into ``network`` and
        ``tally``.

        Raises:
            ConfigError: the checkpoint was written with another number of workers or rounds per epoch.
            CheckpointDamaged: its file cannot be read.
        """
        point = self.task.resume
        if point is None:
            return 0, 0
        tensors, meta = read_rank_file(point.path, 0)
        saved = (meta.get("algo") or {}).get("rounds")
        if saved != {"workers": self.workers, "rounds": self.rounds}:
            raise ConfigError(
                f"run {point.run_id!r}: its checkpoint {point.path} was written by a fit of {saved} "
                f"but this one has {self.workers} workers and {self.rounds} rounds per epoch; resume "
                "with the same data, batch size, averaging_frequency and num_workers, or use a new "
                "run_id"
            )
        network.set_params(tensors["params"])
        network.set_updater_state(tensors["updater_state"])
        network.amp.load_state_tensors(tensors)
        network.load_buffer_state({k[len("buffer.") :]: v for k, v in tensors.items() if k.startswith("buffer.")})
        network.iteration, network.epoch = int(meta["iteration"]), int(meta["epoch"])
        tally.restore(meta["algo"]["tally"])
        return point.fit_epoch, int(meta["done"])

    def _record(self, tally: Tally) -> tuple[RankProgress, dict[str, Any]]:
        progress = RankProgress(sum(tally.examples), sum(tally.iterations))
        return progress, {"rounds": {"workers": self.workers, "rounds": self.rounds}, "tally": tally.state()}

    def round_end(self, network: Network, epoch: int, done: int, tally: Tally, rec: PhaseRecorder) -> None:
        """Round ``done`` (1-based) of ``epoch`` was averaged, and was not the epoch's last."""
        if self.writer is not None:
            with rec.phase("checkpoint"):
                progress, meta = self._record(tally)
                self.writer.round_end(network, epoch, done, progress, {}, meta, self.rounds)

    def epoch_end(self, network: Network, next_epoch: int, last: bool, tally: Tally, rec: PhaseRecorder) -> None:
        """An epoch ended (``network.epoch`` already advanced); ``last``: the fit's last."""
        if self.writer is not None:
            with rec.phase("checkpoint"):
                progress, meta = self._record(tally)
                self.writer.epoch_end(network, next_epoch, last, progress, {}, meta)
                if last:
                    self.writer.close()


class Tally:
    """The driver's per-worker totals over one fit: progress updates, results and stats payloads."""

    def __init__(self, workers: int) -> None:
        self.examples = [0] * workers
        self.iterations = [0] * workers
        self.scores = [math.nan] * workers
        self.epoch_examples = [0] * workers
        self.epoch_iterations = [0] * workers
        self.payloads: list[list[dict[str, Any]]] = [[] for _ in range(workers)]
        self.placements: list[dict[str, Any] | None] = [None] * workers  # the last round's

    def state(self) -> dict[str, Any]:
        """The totals as JSON (for a checkpoint; the stats payloads and placements are not kept)."""
        return {
            "examples": self.examples,
            "iterations": self.iterations,
            "epoch_examples": self.epoch_examples,
            "epoch_iterations": self.epoch_iterations,
            "scores": [None if math.isnan(s) else s for s in self.scores],
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from `state` (a resumed fit reports the totals one uninterrupted fit would)."""
        for key in ("examples", "iterations", "epoch_examples", "epoch_iterations"):
            setattr(self, key, [int(v) for v in state[key]])
        self.scores = [math.nan if s is None else float(s) for s in state["scores"]]

    def start_epoch(self) -> None:
        self.epoch_examples = [0] * len(self.examples)
        self.epoch_iterations = [0] * len(self.examples)

    def add(self, record: Any, epoch: int) -> list[ProgressUpdate]:  # a rounds.RoundRecord
        """Count one round; returns a progress update per worker that trained in it (counts within the epoch)."""
        updates = []
        for rank, w in sorted(record.workers.items()):
            self.examples[rank] += w.examples
            self.iterations[rank] += w.iterations
            self.epoch_examples[rank] += w.examples
            self.epoch_iterations[rank] += w.iterations
            self.scores[rank] = w.score
            if w.stats is not None:
                self.payloads[rank].append(w.stats)
            self.placements[rank] = w.placement or self.placements[rank]
            updates.append(ProgressUpdate(rank, epoch, self.epoch_iterations[rank], self.epoch_examples[rank], w.score))
        return updates

    def results(self, network: Network) -> list[WorkerResult]:
        """One result per worker (its totals, own last loss, per-round stats, and where its last round ran: each
        round is a new task, maybe on another executor or GPU); rank 0 carries the final parameters."""
        return [
            WorkerResult(
                rank=rank,
                examples=self.examples[rank],
                iterations=self.iterations[rank],
                score=self.scores[rank],
                params=network.params() if rank == 0 else None,
                updater_state=network.updater_state() if rank == 0 else None,
                buffers=network.buffer_state() if rank == 0 else None,
                stats=self.payloads[rank] or None,
                **(self.placements[rank] or {}),
            )
            for rank in range(len(self.examples))
        ]
