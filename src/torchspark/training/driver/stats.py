"""The training stats of one fit, assembled on the driver from its own phases and every worker's payload."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from torchspark.stats import DRIVER_ID, StatsCollector, TrainingStats
from torchspark.training.task import WorkerResult
from torchspark.training.worker.reporting import worker_id

__all__ = ["build_training_stats", "replica_checksums", "worker_placements"]

log = logging.getLogger(__name__)


def build_training_stats(
    driver: StatsCollector, results: Sequence[WorkerResult], epochs: int, extra: dict[str, Any] | None = None
) -> TrainingStats:
    """The stats of one fit: the driver's phases, every worker's payload, and summary fields (examples, epochs,
    any scalar in ``extra`` such as gradient sharing's byte counts -- the headline ones under their short name only,
    ``bytes_sent`` not also ``sharing.bytes_sent`` --, and every rank's ``param_checksums`` with
    ``replicas_identical`` computed from them -- a measurement, not the workers' word), and where every rank ran
    when its runner reports it (`worker_placements`: ``devices``, ``gpu_addresses``, ``executors``). A
    result's ``stats`` is one payload, or a list of them (the rounds route ships one per round)."""
    stats = TrainingStats()
    stats.add_worker_payload(DRIVER_ID, driver.drain())
    for r in results:
        for payload in r.stats if isinstance(r.stats, list) else [r.stats]:
            if payload is not None:
                stats.add_worker_payload(worker_id(r.rank), payload)
    stats.set_summary("examples", sum(r.examples for r in results))
    stats.set_summary("epochs", epochs)
    for key, value in (extra or {}).items():
        if isinstance(value, (int, float, bool, str)):
            # sharing's headline numbers appear once, under their short name (bytes_sent, threshold ...)
            short = key.split(".", 1)[-1]
            headline = key.startswith("sharing.") and short in _SHARING_HEADLINES
            stats.set_summary(short if headline else key, value)
    checksums = replica_checksums(results)
    if checksums:
        stats.set_summary("param_checksums", checksums)
        stats.set_summary("replicas_identical", len(set(checksums.values())) == 1)
    for key, per_rank in worker_placements(results).items():
        stats.set_summary(key, per_rank)
    return stats


def worker_placements(results: Sequence[WorkerResult]) -> dict[str, dict[str, Any]]:
    """Where every rank trained, by rank (string keys, JSON): ``devices`` (``{"0": "cuda:0", ...}``),
    ``gpu_addresses`` (the addresses Spark assigned to its task: ``{"0": ["1"], ...}``, ``[]`` for none) and
    ``executors``; each only when the runner reported it. E.g. with two GPU workers on one executor
    ``{"gpu_addresses": {"0": ["0"], "1": ["1"]}, "devices": {"0": "cuda:0", "1": "cuda:1"}, ...}``."""
    ranked = sorted(results, key=lambda r: r.rank)
    found: dict[str, dict[str, Any]] = {
        "devices": {str(r.rank): r.device for r in ranked if r.device is not None},
        "gpu_addresses": {str(r.rank): list(r.gpu_addresses) for r in ranked if r.gpu_addresses is not None},
        "executors": {str(r.rank): r.executor for r in ranked if r.executor is not None},
    }
    return {key: per_rank for key, per_rank in found.items() if per_rank}


def replica_checksums(results: Sequence[WorkerResult]) -> dict[str, str]:
    """Every rank's parameter checksum (``{"0": "3fa1...", "1": ...}``; keys are strings so the summary stays JSON),
    empty when the route keeps no replicas. Equal values are the measurement behind ``replicas_identical``."""
    return {
        str(r.rank): r.param_checksum for r in sorted(results, key=lambda r: r.rank) if r.param_checksum is not None
    }


#: gradient sharing's headline numbers, also given in the summary without their ``sharing.`` prefix
_SHARING_HEADLINES = ("bytes_sent", "dense_bytes", "threshold", "start_threshold")
