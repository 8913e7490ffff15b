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


def _hanging_fit(spark, sc, tmp_path, after: int, **options) -> WorkerLost:
    """The WorkerLost of a fit (2 workers, 50 steps each, no retry) whose every task waits 8 s in each training
    step after its ``after``-th: without a watchdog it would succeed after (50 - after) x 8 s."""
    data = datasets.synthetic_classification(400, 12, 3, seed=1)
    hang = HangingMLP(12, 8, 3, marker=str(tmp_path / "never"), after=after, limit_s=8)
    net = Network(hang, updater=optim.SGD(lr=0.1), seed=0)
    master = ParameterAveragingTrainingMaster(
        num_workers=2, batch_size_per_worker=4, rdd_training_approach="direct", max_failures=0, **options
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    try:
        with pytest.raises(WorkerLost) as info:
            spark_net.fit(sc.parallelize(data.split(8), 2), epochs=1)
    finally:
        spark_net.delete_temp_files()
    return info.value


def test_every_task_hanging_at_once_is_cancelled_by_the_progress_watchdog(spark, sc, tmp_path) -> None:
    # progress reports at steps 10, 20, ...; every task hangs after its 25th step
    error = _hanging_fit(
        spark, sc, tmp_path, after=25, averaging_frequency=1, rendezvous_timeout_s=60, stall_timeout_s=4
    )
    message = str(error)
    assert error.exit_status == "no progress", message
    assert "attempt 0: every worker stuck (no progress)" in message
    assert "[worker 0: epoch 0, minibatch 20; worker 1: epoch 0, minibatch 20]" in message


def test_a_round_whose_tasks_hang_is_cancelled_on_the_rounds_route(spark, sc, tmp_path) -> None:
    """``averaging_via="spark"``: no live progress, one Spark job per round (25 rounds of 2 steps); a round running
    past stall_timeout_s is cancelled."""
    error = _hanging_fit(spark, sc, tmp_path, after=10, averaging_frequency=2, averaging_via="spark", stall_timeout_s=4)
    message = str(error)
    assert error.exit_status == "no progress", message
    # a Python worker's cached network hangs from its 11th step: round 6 of 25 at the earliest (a worker replaced
    # by Spark in between would start counting again)
    found = re.search(r"the averaging round epoch 1, round (\d+)/25 has run for", message)
    assert found and int(found.group(1)) >= 6, message
    assert "longer than stall_timeout_s=4" in message
