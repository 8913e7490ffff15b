"""Elastic recovery on Spark grows back at an epoch boundary: the driver asks the barrier runner for its free task
slots (the preflight's count) when a smaller world ends its epoch, and with the slots there the next attempt runs
every worker again, without waiting for another failure. The losses are injected around the real barrier stages
(deterministic: a local-cluster executor that comes back registers at a time no test can pin to an epoch); the
stages, the slot count, the re-sharded checkpoints and the re-dealt partitions are real."""

from __future__ import annotations

from functools import partial

from helpers import mlp_net
from torchspark import datasets, optim
from torchspark.errors import WorkerLost
from torchspark.spark import SharedTrainingMaster, SparkNetwork
from torchspark.spark.preflight import task_slots
from torchspark.spark.runners import SparkBarrierRunner

EPOCHS = 2
_net = partial(mlp_net, 12, 16, 3, updater=optim.Adam(lr=1e-2))


class LosingBarrierRunner:
    """The real :class:`SparkBarrierRunner`, whose attempts 0 and 1 end at once with rank 1 lost: a slot that died
    twice, so the world shrinks to 1 though Spark has 2 slots."""

    def __init__(self, sc, master) -> None:
        self.inner = SparkBarrierRunner(sc, master.mesh)
        self.worlds: list[int] = []
        self.epochs: list[int] = []
        self.slots_seen: list[int] = []

    def capacity(self) -> int:
        self.slots_seen.append(self.inner.capacity())
        return self.slots_seen[-1]

    def run(self, task, data, context):
        self.worlds.append(data.workers)
        self.epochs.append(task.epochs)
        if context.attempt < 2:
            raise WorkerLost("injected: worker 1 lost", rank=1, exit_status="signal SIGKILL", reason="injected")
        return self.inner.run(task, data, context)


def test_free_slots_at_an_epoch_boundary_grow_the_world_back(spark, sc, tmp_path) -> None:
    master = SharedTrainingMaster(
        batch_size_per_worker=8,
        num_workers=2,
        min_workers=1,
        rng_seed=0,
        collect_training_stats=True,
        checkpoint_directory=str(tmp_path),
        rdd_training_approach="direct",
    )
    net = _net()
    runner = LosingBarrierRunner(sc, master)
    spark_net = SparkNetwork(spark, net, master, progress=False, runner=runner)
    spark_net.fit(sc.parallelize(datasets.synthetic_classification(192, 12, 3, seed=1).split(48), 2), epochs=EPOCHS)

    # attempt 2 (one worker) ran to the boundary of epoch 1 only; then the slots were there: attempt 3 ran both
    assert runner.worlds == [2, 2, 1, 2] and runner.epochs == [EPOCHS, EPOCHS, 1, EPOCHS]
    assert runner.slots_seen[-1] == task_slots(sc) >= 2
    summary = spark_net.training_stats.summary()
    changes = [(c["attempt"], c["epoch"], c["old"], c["new"], c["reason"]) for c in summary["world_changes"]]
    assert changes == [
        (2, 0, 2, 1, "worker 1 was lost in two attempts in a row"),  # no checkpoint yet: from the start
        (3, 1, 1, 2, "capacity returned"),
    ]
    assert len(summary["failures"]) == 2 and len(spark_net.last_results) == 2
    assert net.epoch == EPOCHS and summary["examples"] == EPOCHS * 192
