"""The contract between the driver and its workers: the [`WorkerTask`][torchspark.training.WorkerTask] a driver hands every worker, the
[`WorkerResult`][torchspark.training.WorkerResult] each hands back, the `EpochSource` a worker reads its data from, and how the driver
applies the results ([`merge_results`][torchspark.training.merge_results]). A leaf: the driver, the runners and the worker loop all import it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from torchspark.nn import Network
from torchspark.training.checkpoint.config import CheckpointPlan, ResumePoint

__all__ = ["WorkerTask", "WorkerResult", "EpochSource", "merge_results", "mean_score", "param_checksum"]


@dataclass(frozen=True)
class WorkerTask:
    """Everything a worker needs besides its data and its peers (small; broadcast once per fit).

    Args:
        mode: the algorithm (``"averaging"``, ``"sharing"`` or ``"stale_sharing"``), a key of [`ALGORITHMS`][torchspark.training.ALGORITHMS].
        settings: the algorithm's settings as a JSON-able dict.
        blueprint: ``NetworkBlueprint.to_bytes()`` of the driver's network.
        epochs: passes over the data inside this one stage.
        prefetch: minibatches loaded ahead on a background thread (0 = none).
        pin_memory: the master's ``pin_memory``: None or True pins minibatches in host memory on the loading
            thread when the worker trains on CUDA (`pins_memory`).
        data_timeout_s: how long to wait for one minibatch before failing.
        num_threads: torch intra-op threads (the cores the task owns); None leaves torch's default.
        collect_stats: record phases for the training stats.
        report_scores: send the driver the score every worker agrees on after each averaging round (each epoch
            with gradient sharing, at the cost of one small all-reduce); the runner wires it into the hooks.
        attempt: which launch of the workers this is (0 first; the driver's recovery adds one per relaunch).
        flush_denormal: flush denormal floats to zero on the worker's CPU threads (why: the ``flush_denormal``
            option of [`TrainingMaster`][torchspark.TrainingMaster]); restored to IEEE mode for the calling thread when
            the worker returns.
        checkpoint: where and how often the workers checkpoint the fit (None: never); see
            `torchspark.training.checkpoint`.
        resume: the checkpoint this launch continues from (set by
            `resume_task`; None: start from the blueprint, epoch 0).
    """

    mode: str
    settings: dict[str, Any]
    blueprint: bytes
    epochs: int = 1
    prefetch: int = 2
    pin_memory: bool | None = None
    data_timeout_s: float = 600.0
    num_threads: int | None = None
    collect_stats: bool = False
    flush_denormal: bool = True
    report_scores: bool = False
    attempt: int = 0
    checkpoint: CheckpointPlan | None = None
    resume: ResumePoint | None = None
    #: the network's epoch counter when the fit starts: epoch ``e`` of this fit is epoch ``first_epoch + e``
    first_epoch: int = 0
    #: minibatches per optimizer step (the master's ``accumulate_steps``): the worker trains its stream in groups of
    #: this many ([`group_batches`][torchspark.data.group_batches]); every count an algorithm keeps is then in optimizer steps
    accumulate_steps: int = 1
    #: the master's ``rng_seed``: with it, every epoch after the first trains this worker's minibatches in a new
    #: order, a pure function of ``(shuffle_seed, epoch, rank)`` (routes that plan every epoch across workers hand
    #: `EpochItems` instead, which are trained as planned)
    shuffle_seed: int | None = None


@dataclass
class WorkerResult:
    """What a worker hands back to the driver. Only rank 0 carries the (identical) parameters."""

    rank: int
    examples: int
    iterations: int
    score: float
    params: torch.Tensor | None = None
    updater_state: torch.Tensor | None = None
    #: fp16's gradient-scaler state (``net.amp.state_tensors()``); rank 0 only, empty for fp32 and bf16
    scaler_state: dict[str, torch.Tensor] = field(default_factory=dict)
    extra_state: dict[str, torch.Tensor] = field(default_factory=dict)
    extra_config: dict[str, Any] = field(default_factory=dict)
    stats: Any = None
    #: every module buffer by name (BatchNorm running statistics, counters); rank 0 only
    buffers: dict[str, torch.Tensor] | None = None
    #: torch intra-op threads the worker trained with (``torch.get_num_threads()``; on Spark the task's
    #: ``spark.task.cpus``); None when the runner does not report it
    threads: int | None = None
    #: [`param_checksum`][torchspark.training.WorkerResult.param_checksum] of this rank's replica after the fit (every rank): equal on all ranks when the
    #: replicas are identical; None when the route keeps no replicas (``averaging_via="spark"``)
    param_checksum: str | None = None
    #: how this worker reached its peers on a Spark barrier stage (address, interface, which rule chose them,
    #: whether sums went through shared memory); None on other runners
    network: dict[str, Any] | None = None
    #: the torch device this worker trained on (``"cpu"``, ``"cuda:0"``); None when the runner does not report it
    device: str | None = None
    #: the GPU addresses Spark assigned to this worker's task (``TaskContext.resources()["gpu"].addresses``; empty
    #: when it got none); None when the runner does not report them
    gpu_addresses: tuple[str, ...] | None = None
    #: the executor the worker's task ran on (host and working directory, as the preflight names it); None when
    #: the runner does not report it
    executor: str | None = None


class EpochSource(Protocol):
    """A worker's data, iterable once per epoch. Items are batches, batch-file paths or batch bytes."""

    def epoch(self, index: int) -> Iterable[Any]: ...


def param_checksum(net: Network) -> str:
    """SHA-256 (hex, first 16 digits) of a replica's parameters and floating-point buffers, as stored: two ranks
    give the same checksum exactly when their replicas are bit-identical (up to a hash collision)."""
    digest = hashlib.sha256(net.params().detach().cpu().numpy().tobytes())
    digest.update(net.buffers().detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def merge_results(net: Network, results: Sequence[WorkerResult]) -> float:
    """Apply the workers' results to the driver's network; returns [`mean_score`][torchspark.training.mean_score] of the results."""
    lead = next((r for r in results if r.rank == 0), None)
    if lead is None or lead.params is None:
        raise RuntimeError("no result from worker rank 0")
    net.set_params(lead.params)
    if lead.updater_state is not None:
        net.set_updater_state(lead.updater_state)
    net.amp.load_state_tensors(lead.scaler_state)
    if lead.buffers:
        net.load_buffer_state(lead.buffers)
    for r in results:
        net.extra_state.update(r.extra_state)
    net.extra_config.update(lead.extra_config)
    net.iteration += max(r.iterations for r in results)
    return mean_score(results)


def mean_score(results: Sequence[WorkerResult]) -> float:
    """A fit's score (``score``): the plain mean over the workers of each one's own last minibatch loss, as
    DL4J reports it (score sum / workers). Workers that trained nothing are left out; NaN if none trained."""
    scores = [r.score for r in results if not math.isnan(r.score)]
    return sum(scores) / len(scores) if scores else math.nan
