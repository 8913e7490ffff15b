"""Building a worker's hooks: a stats collector on the driver's clock and a progress connection to the driver."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from torchspark.stats import DRIVER_ID, StatsCollector, TrainingStats
from torchspark.training.hooks import NullRecorder, WorkerHooks
from torchspark.training.progress import ProgressClient, ProgressEndpoint
from torchspark.training.worker import WorkerResult

__all__ = ["open_worker_hooks", "worker_id", "build_training_stats"]

log = logging.getLogger(__name__)


def worker_id(rank: int) -> str:
    """The name a worker has in stats and reports."""
    return f"worker-{rank}"


def open_worker_hooks(
    rank: int,
    collect_stats: bool,
    progress_address: ProgressEndpoint | None,
    progress_every: int = 10,
    timeout_s: float = 10.0,
    report_scores: bool = False,
) -> WorkerHooks:
    """Hooks for one worker: progress and errors stream to ``progress_address`` (the driver's
    :class:`~torchspark.training.progress.ProgressServer`: its ``endpoint``, with the fit's token), phases go to a :class:`StatsCollector` whose clock
    is aligned to the driver's by pinging that server (no NTP needed). With ``report_scores`` (pass the same value
    on every rank) the score after each averaging round / sharing epoch goes there too (sent by rank 0)."""
    client: ProgressClient | None = None
    if progress_address is not None:
        client = ProgressClient.to(progress_address, rank, timeout_s=timeout_s).connect()
    recorder: Any = NullRecorder()
    if collect_stats:
        driver_minus_worker = client.measure_clock_offset() if client is not None else 0.0
        recorder = StatsCollector(worker_id(rank), clock_offset=-driver_minus_worker)
    return WorkerHooks(
        recorder=recorder,
        progress=client,
        progress_every=progress_every,
        report_score=client.send_score if client is not None and report_scores else None,
        report_error=client.send_error if client is not None else None,
        close=client.close if client is not None else None,
    )


def build_training_stats(driver: StatsCollector, results: Sequence[WorkerResult], epochs: int,
                         extra: dict[str, Any] | None = None) -> TrainingStats:
    """The stats of one fit: the driver's phases, every worker's payload, and summary fields (examples, epochs,
    and any scalar in ``extra`` such as gradient sharing's ``replicas_identical`` and byte counts). A result's
    ``stats`` is one payload, or a list of them (the rounds route ships one per round)."""
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
            stats.set_summary(key, value)
            short = key.split(".", 1)[-1]
            if key.startswith("sharing.") and short in _SHARING_HEADLINES:
                stats.set_summary(short, value)
    return stats


#: gradient sharing's headline numbers, also given in the summary without their ``sharing.`` prefix
_SHARING_HEADLINES = ("bytes_sent", "dense_bytes", "replicas_identical", "threshold")
