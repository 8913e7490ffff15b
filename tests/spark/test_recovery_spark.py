"""Automatic recovery on Spark with real processes: kill -9 one training worker's Python process mid-fit on
``local[2]`` (both masters); the driver relaunches the barrier stage and the fit completes. What happened is named
(worker, Spark's reason) in the error and in the stats."""

from __future__ import annotations

import signal

import pytest
from _faults import Fault

from helpers import lenet_net
from torchspark import datasets, optim
from torchspark.errors import WorkerLost
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

EPOCHS = 3


def _masters(**kw):
    common = dict(
        batch_size_per_worker=16, num_workers=2, rng_seed=0, collect_training_stats=True, rendezvous_timeout_s=20, **kw
    )
    return {
        "averaging": ParameterAveragingTrainingMaster(averaging_frequency=5, **common),
        "sharing": SharedTrainingMaster(**common),
    }


def _fit(spark, sc, master, fault=None):
    train = datasets.digits("train")
    net = lenet_net(updater=optim.Adam(lr=1e-3))
    spark_net = SparkNetwork(spark, net, master, progress=False)
    if fault is not None:
        spark_net.add_progress_listener(fault)
    try:
        spark_net.fit(sc.parallelize(train.split(64), 2), epochs=EPOCHS)
    finally:
        spark_net.delete_temp_files()
    return net, spark_net


@pytest.fixture(scope="module")
def undisturbed(spark, sc) -> dict[str, float]:
    test = datasets.digits("test")
    return {name: _fit(spark, sc, master)[0].evaluate(test).accuracy() for name, master in _masters().items()}


@pytest.mark.parametrize("name", ["averaging", "sharing"])
def test_a_killed_python_worker_is_relaunched_and_the_fit_completes(spark, sc, name, undisturbed, leftovers) -> None:
    fault = Fault(signal.SIGKILL)
    net, spark_net = _fit(spark, sc, _masters()[name], fault)
    leftovers.assert_clean(gone=fault.hit, pids=fault.all_pids)

    assert len(fault.hit) == 1 and len(fault.seen) == 2  # rank 1's first process killed, a second one finished
    accuracy = net.evaluate(datasets.digits("test")).accuracy()
    assert abs(accuracy - undisturbed[name]) <= 0.02, (accuracy, undisturbed[name])
    assert net.epoch == EPOCHS
    summary = spark_net.training_stats.summary()
    [failure] = summary["failures"]
    assert failure["attempt"] == 0 and failure["rank"] == 1 and failure["pid"] == fault.hit[0]
    assert failure["exit_status"] is not None, failure  # Spark gives no code for a killed Python worker: "crashed"
    _assert_sparks_words(failure["reason"])
    assert summary["recovered_from"]["attempt"] == 1
    assert summary["examples"] == EPOCHS * 1437


def test_without_retries_the_error_names_the_worker_and_sparks_reason(spark, sc, leftovers) -> None:
    fault = Fault(signal.SIGKILL, epoch=0)
    with pytest.raises(WorkerLost) as info:
        _fit(spark, sc, _masters(max_failures=0)["averaging"], fault)
    leftovers.assert_clean(gone=fault.hit, pids=fault.all_pids)

    message = str(info.value)
    assert message.startswith("attempt 0: worker 1 "), message  # the lost worker, also when Spark names a peer
    assert "torchspark fit: 2 workers, 3 epoch(s): " in message
    _assert_sparks_words(message)
    assert "java.base/java.lang.Thread.run" not in message.splitlines()[0]
    assert "max_failures=0" in message and f"pid {fault.hit[0]}" in message
    assert info.value.__cause__ is not None  # Spark's exception stays chained
    assert info.value.rank == 1


def _assert_sparks_words(text: str) -> None:
    """Spark's own reason: the crashed Python worker, or (when Spark reports the peer first, a race) the peer's
    last line as it saw the loss; never a Java stack frame."""
    assert "Stage failed because barrier task ResultTask(" in text, text
    assert "Python worker exited unexpectedly" in text or " saw: " in text, text
    assert "\tat " not in text.split("--- a peer's traceback")[0], text
