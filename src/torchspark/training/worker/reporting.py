"""Building a worker's hooks: a stats collector on the driver's clock and a progress connection to the driver.

A module of its own, light to import: `run(fn)`'s ranks (torchspark.ranks) open their hooks here without loading
the training loop that `torchspark.training.worker.body` imports."""

from __future__ import annotations

from typing import Any

from torchspark.stats import StatsCollector
from torchspark.training.hooks import NullRecorder, WorkerHooks
from torchspark.training.progress import DirectoryProgressWriter, ProgressClient, ProgressDirectory, ProgressEndpoint

__all__ = ["open_worker_hooks", "worker_id"]


def worker_id(rank: int) -> str:
    """The name a worker has in stats and reports."""
    return f"worker-{rank}"


def open_worker_hooks(
    rank: int,
    collect_stats: bool,
    progress_address: ProgressEndpoint | ProgressDirectory | None,
    progress_every: int = 10,
    timeout_s: float = 10.0,
    report_scores: bool = False,
) -> WorkerHooks:
    """Hooks for one worker: progress and errors stream to ``progress_address`` (the driver's `ProgressServer`: its
    ``endpoint``, with the fit's token), phases go to a [`StatsCollector`][torchspark.stats.StatsCollector] whose
    clock is aligned to the driver's by pinging that server (no NTP needed). With ``report_scores`` (pass the same value
    on every rank) the score after each averaging round / sharing epoch goes there too (sent by rank 0).
    A `ProgressDirectory` instead of an endpoint writes the same messages to
    files there (the directory channel: no connection to the driver; stats stay on the worker's clock)."""
    client: ProgressClient | DirectoryProgressWriter | None = None
    if isinstance(progress_address, ProgressDirectory):
        client = DirectoryProgressWriter(progress_address, rank).connect()
    elif progress_address is not None:
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
