"""Training statistics: timed phases per worker, score and encoding series, and an offline HTML timeline report.

Workers (and the driver) record with a [`StatsCollector`][torchspark.stats.StatsCollector]; its [`drain`][torchspark.stats.StatsCollector.drain] payload travels
to the driver, which merges payloads into [`TrainingStats`][torchspark.stats.TrainingStats] for ``summary()``, JSON and ``export_html()``.
Worker clocks are put on the driver's time axis with the ping math of `torchspark.stats.clock`.
This package does not import pyspark, so a local-process ParallelWrapper uses it too.
"""

from __future__ import annotations

from torchspark.stats.clock import ClockSample, best_clock_sample, clock_offset, clock_sample, to_driver_time
from torchspark.stats.collector import StatsCollector
from torchspark.stats.events import (
    DRIVER_ID,
    PAYLOAD_FORMAT,
    STANDARD_PHASES,
    EncodingTable,
    EventTable,
    Phase,
    PhaseEvent,
    ScoreTable,
    phase_name,
)
from torchspark.stats.training_stats import TrainingStats

__all__ = [
    "StatsCollector",
    "TrainingStats",
    "Phase",
    "STANDARD_PHASES",
    "DRIVER_ID",
    "PAYLOAD_FORMAT",
    "phase_name",
    "PhaseEvent",
    "EventTable",
    "ScoreTable",
    "EncodingTable",
    "ClockSample",
    "clock_offset",
    "clock_sample",
    "best_clock_sample",
    "to_driver_time",
]
