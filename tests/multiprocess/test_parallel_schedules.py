"""A learning-rate schedule and L1 travel to ParallelWrapper's worker processes and drive every step there."""

from __future__ import annotations

import pytest
import torch

from reference_loops import averaging_reference
from torchspark import Network, datasets, models, optim
from torchspark.parallel import ParallelWrapper
from torchspark.schedules import MapSchedule
from torchspark.training.assignment import split_examples

BATCH = 8


def test_schedule_and_l1_reach_the_worker_processes() -> None:
    data = datasets.synthetic_classification(64, 12, 3, seed=5)  # 4 minibatches per worker and epoch
    schedule = MapSchedule({0: 0.3, 2: 0.05, 5: 0.01})  # changes inside the first and the second epoch

    def network(lr) -> Network:
        return Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=lr, fused=False), seed=0, l1=1e-3)

    net = network(schedule)
    shards = split_examples([data], BATCH, 2, None)
    expected = averaging_reference(net, shards, epochs=2, frequency=1, save_updater=True)
    fixed = averaging_reference(network(0.3), shards, epochs=2, frequency=1, save_updater=True)
    ParallelWrapper(
        net, num_workers=2, training_mode="averaging", averaging_frequency=1, threads_per_worker=1, progress=False
    ).fit(data, epochs=2, batch_size=BATCH)
    torch.testing.assert_close(net.params(), expected.params())
    assert not torch.allclose(net.params(), fixed.params(), atol=1e-4), "the schedule must matter"
    assert net.iteration == 8 and net.current_lr() == pytest.approx(0.01)
