"""The progress watchdog on Spark: every barrier task hangs in the model's code at once (heartbeats go on, no
collective waits); the driver's watchdog cancels the stage after ``stall_timeout_s`` without a new step, as on
``ParallelWrapper`` (tests/multiprocess/test_recovery_parallel.py, where the repeated-hang rule is exercised too)."""

from __future__ import annotations

import re

import cloudpickle
import pytest

import hanging
from hanging import HangingMLP
from torchspark import Network, datasets, optim
from torchspark.errors import WorkerLost
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork

cloudpickle.register_pickle_by_value(hanging)  # the executors rebuild the model without tests/ on their path


def test_every_task_hanging_at_once_is_cancelled_by_the_progress_watchdog(spark, sc, tmp_path) -> None:
    data = datasets.synthetic_classification(400, 12, 3, seed=1)  # 50 steps per worker: progress at 10, 20, ...
    # every task waits limit_s in each step after the 25th: without the watchdog the fit would succeed after 25 x 8 s
    hang = HangingMLP(12, 8, 3, marker=str(tmp_path / "never"), after=25, limit_s=8)
    net = Network(hang, updater=optim.SGD(lr=0.1), seed=0)
    master = ParameterAveragingTrainingMaster(
        num_workers=2,
        batch_size_per_worker=4,
        averaging_frequency=1,
        rdd_training_approach="direct",
        rendezvous_timeout_s=60,
        stall_timeout_s=4,
        max_failures=0,
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    try:
        with pytest.raises(WorkerLost) as info:
            spark_net.fit(sc.parallelize(data.split(8), 2), epochs=1)
    finally:
        spark_net.delete_temp_files()
    message = str(info.value)
    assert info.value.exit_status == "no progress", message
    assert "attempt 0: every worker stuck (no progress)" in message
    assert "[worker 0: epoch 0, minibatch 20; worker 1: epoch 0, minibatch 20]" in message


def test_a_round_whose_tasks_hang_is_cancelled_on_the_rounds_route(spark, sc, tmp_path) -> None:
    """``averaging_via="spark"``: no live progress, one Spark job per round; a round running past stall_timeout_s
    is cancelled (the tasks would wait 8 s in each of their steps after the 10th)."""
    data = datasets.synthetic_classification(400, 12, 3, seed=1)  # 50 steps per worker: 25 rounds of 2
    hang = HangingMLP(12, 8, 3, marker=str(tmp_path / "never"), after=10, limit_s=8)
    net = Network(hang, updater=optim.SGD(lr=0.1), seed=0)
    master = ParameterAveragingTrainingMaster(
        num_workers=2,
        batch_size_per_worker=4,
        averaging_frequency=2,
        averaging_via="spark",
        rdd_training_approach="direct",
        stall_timeout_s=4,
        max_failures=0,
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    try:
        with pytest.raises(WorkerLost) as info:
            spark_net.fit(sc.parallelize(data.split(8), 2), epochs=1)
    finally:
        spark_net.delete_temp_files()
    message = str(info.value)
    assert info.value.exit_status == "no progress", message
    # a Python worker's cached network hangs from its 11th step: round 6 of 25 at the earliest (a worker replaced
    # by Spark in between would start counting again)
    found = re.search(r"the averaging round epoch 1, round (\d+)/25 has run for", message)
    assert found and int(found.group(1)) >= 6, message
    assert "longer than stall_timeout_s=4" in message
