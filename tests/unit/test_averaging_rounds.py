"""Parameter averaging runs DL4J's number of rounds: ceil(most minibatches / averaging_frequency) per epoch, with
no trailing empty round when a worker's minibatch count is a multiple of the frequency."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import uniform_batches
from reference_loops import averaging_reference
from torchspark import Network, models, optim
from torchspark.nn import NetworkBlueprint
from torchspark.stats import StatsCollector, TrainingStats
from torchspark.training import InProcessRunner, ItemSource, WorkerTask
from torchspark.training.hooks import WorkerHooks
from torchspark.training.task import merge_results


@pytest.mark.parametrize(
    "counts,frequency",
    [
        ((6, 6), 3),  # multiples of the frequency: the case that used to add an empty round
        ((6, 3), 3),  # one worker finishes a round early and joins the last one with n = 0
        ((7, 2), 3),  # a partial last round
        ((4, 0), 2),  # a worker without data
        ((1, 1), 1),
    ],
)
def test_rounds_per_epoch_follow_the_data_position(counts: tuple[int, int], frequency: int) -> None:
    shards = [uniform_batches(n, seed=i) for i, n in enumerate(counts)]
    net = Network(models.mlp(64, 8, 10), updater=optim.Adam(lr=1e-2), seed=0)
    expected_net = averaging_reference(net, shards, epochs=2, frequency=frequency, save_updater=True)
    collectors = [StatsCollector(f"worker-{r}") for r in range(len(shards))]
    reports = []

    def hooks(rank: int) -> WorkerHooks:
        return WorkerHooks(recorder=collectors[rank], report_score=reports.append if rank == 0 else None)

    task = WorkerTask(
        "averaging",
        {"averaging_frequency": frequency, "save_updater": True},
        NetworkBlueprint.of(net).to_bytes(),
        epochs=2,
        prefetch=0,
    )
    results = InProcessRunner(timeout_s=60, hooks_factory=hooks).run(task, [ItemSource(s) for s in shards])
    merge_results(net, results)

    rounds = math.ceil(max(counts) / frequency)  # per epoch, as DL4J: iterations % frequency decides
    summary = TrainingStats.from_payloads([r.stats for r in results]).summary()  # the workers drain their collectors
    assert summary["counts"]["averaging"] == 2 * rounds * len(shards)  # every worker joins every round
    assert summary["minibatches"] == 2 * sum(counts)
    assert len(reports) == 2 * rounds
    torch.testing.assert_close(net.params(), expected_net.params())
