"""SparkNetwork.fit through a Spark Connect session: one barrier mapInArrow stage over a DataFrame.

The reference for "the same parameters as the classic route": the classic route cannot run in this process (a
Connect client switches pyspark into Connect mode for the whole process), so the Connect fit is compared with
``ParallelWrapper`` on the same data, seed and settings, which tests/spark/test_parallel_equivalence.py shows gives
the classic route's parameters to 1e-6 (one torch thread per worker on every side).
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from functools import partial
from pathlib import Path

import cloudpickle
import pytest
import torch

import interrupting
from helpers import mlp_net, onehot_rule_data
from interrupting import InterruptingMLP
from torchspark import DataSet, Network, datasets, optim
from torchspark.encoding import AdaptiveThreshold
from torchspark.errors import ConfigError, DataError, SetupError, WorkerError, WorkerLost
from torchspark.parallel import ParallelWrapper
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork
from torchspark.training.checkpoint import newest_checkpoint, store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark"))
from _faults import Fault  # noqa: E402  (tests/spark's fault injector)

cloudpickle.register_pickle_by_value(interrupting)  # executors rebuild the model without the tests on their path

BATCH = 8
SEED = 7


def frame(spark, data: DataSet):
    """``data`` as a DataFrame (``features array<double>``, ``label`` long or ``array<double>``), rows in order."""
    label = "long" if data.labels.dim() == 1 else "array<double>"
    rows = [(x.double().tolist(), y.tolist()) for x, y in zip(data.features, data.labels)]
    return spark.createDataFrame(rows, f"features array<double>, label {label}")


_network = partial(mlp_net, 12, 16, 3, updater=optim.SGD(lr=0.1, momentum=0.9))


@pytest.mark.parametrize(("mode", "rng_seed"), [("averaging", SEED), ("sharing", None)])
def test_both_masters_give_the_classic_routes_parameters(connect_spark, tmp_path, mode, rng_seed) -> None:
    data = datasets.synthetic_classification(100, 12, 3, seed=1)  # 12 full minibatches + one of 4 examples
    threshold = AdaptiveThreshold(initial=1e-3)
    own = {"averaging_frequency": 3} if mode == "averaging" else {"threshold_algorithm": threshold}
    cls = ParameterAveragingTrainingMaster if mode == "averaging" else SharedTrainingMaster
    master = cls(batch_size_per_worker=BATCH, num_workers=2, rng_seed=rng_seed, collect_training_stats=True, **own)

    on_connect = _network()
    spark_net = SparkNetwork(connect_spark, on_connect, master, progress=False)
    assert spark_net.sc is None
    spark_net.fit(frame(connect_spark, data), epochs=2)

    local = _network()
    wrapper = ParallelWrapper(
        local, num_workers=2, training_mode=mode, rng_seed=rng_seed, threads_per_worker=1, progress=False, **own
    )
    wrapper.fit(data, epochs=2, batch_size=BATCH)

    assert [r.examples for r in spark_net.last_results] == [r.examples for r in wrapper.last_results] == [100, 100]
    torch.testing.assert_close(on_connect.params(), local.params(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(on_connect.updater_state(), local.updater_state(), atol=1e-6, rtol=1e-6)
    assert on_connect.epoch == 2
    # stats came back as rows and align on the client's clock: the timeline report renders
    stats = spark_net.training_stats
    assert stats.summary()["examples"] == 200
    # where each rank trained came back too (no GPU was assigned: the CPU, no addresses, an executor's name)
    assert [r.device for r in spark_net.last_results] == ["cpu", "cpu"]
    assert [list(r.gpu_addresses or []) for r in spark_net.last_results] == [[], []]
    assert all(r.executor for r in spark_net.last_results)
    stats.export_html(str(tmp_path / "timeline.html"))
    assert "worker" in (tmp_path / "timeline.html").read_text()


def test_rdd_and_list_inputs_are_refused_naming_the_dataframe_route(connect_spark) -> None:
    spark_net = SparkNetwork(connect_spark, _network(), ParameterAveragingTrainingMaster(num_workers=2))
    data = datasets.synthetic_classification(16, 12, 3, seed=1)
    for wrong in (data.split(8), data):
        with pytest.raises(
            ConfigError,
            match=r"training on a (list|DataSet) needs a classic Spark session.*"
            r"Spark Connect session.*pass a DataFrame",
        ):
            spark_net.fit(wrong)


@pytest.mark.parametrize(
    ("master", "words"),
    [
        (ParameterAveragingTrainingMaster(num_workers=2, averaging_via="spark"), "averaging_via='torch'"),
        (SharedTrainingMaster(workers_per_node=1), "set num_workers"),
        (ParameterAveragingTrainingMaster(num_workers=2, repartition="never"), "repartition='always'"),
        (ParameterAveragingTrainingMaster(num_workers=2, repartition_strategy="spark_default"), "'balanced'"),
        (SharedTrainingMaster(num_workers=2, gpus_per_worker=1), "spark.task.resource.gpu.amount"),
    ],
)
def test_settings_a_connect_session_cannot_run_are_refused(connect_spark, master, words) -> None:
    data = datasets.synthetic_classification(16, 12, 3, seed=1)
    with pytest.raises(ConfigError, match=words):
        SparkNetwork(connect_spark, _network(), master).fit(frame(connect_spark, data))


@pytest.mark.timeout(180)  # without the pre-check Spark re-checks the slots for ~10 minutes (SPARK-24819)
def test_more_workers_than_slots_fails_fast_as_on_a_classic_session(connect_spark) -> None:
    """The server is ``local[2]``: three workers cannot run as one barrier stage; the classic pre-check's error."""
    data = datasets.synthetic_classification(24, 12, 3, seed=1)
    master = ParameterAveragingTrainingMaster(num_workers=3, batch_size_per_worker=4)
    with pytest.raises(
        SetupError, match=r"num_workers=3 but the Spark session has only 2 task slot.*Lower num_workers"
    ):
        SparkNetwork(connect_spark, _network(), master, progress=False).fit(frame(connect_spark, data))


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ([([1.0] * 12, 0), (None, 1)], r"column 'features' has 8 null row\(s\).*dropna"),
        ([([1.0] * 12, 0), ([1.0] * 11, 1)], "column 'features' has arrays of different lengths \\(11 to 12 values\\)"),
        ([([1.0] * 12, 0), ([1.0] * 11 + [None], 1)], "column 'features' has null values inside its arrays"),
        ([([1.0] * 12, 0), ([1.0] * 12, None)], "column 'label' has 8 null values"),
    ],
)
def test_nulls_and_ragged_arrays_fail_before_training(connect_spark, rows, words) -> None:
    df = connect_spark.createDataFrame(rows * 8, "features array<double>, label long")
    master = ParameterAveragingTrainingMaster(num_workers=2, batch_size_per_worker=4)
    with pytest.raises(DataError, match=words):
        SparkNetwork(connect_spark, _network(), master, progress=False).fit(df)


def _interrupting(after: int | None = None) -> Network:
    return Network(InterruptingMLP(12, 16, 3, after=after), updater=optim.Adam(lr=0.01), seed=0)


def test_a_worker_error_is_its_own_and_a_fit_resumes_by_run_id(connect_spark, tmp_path) -> None:
    """A worker that raises mid-fit fails the fit with its own error and traceback (not a gRPC blob); the same
    run id then continues from the newest checkpoint and ends where an uninterrupted fit ends."""
    df = frame(connect_spark, onehot_rule_data(96, seed=3))
    epochs, per_worker = 3, 6

    def fit(net: Network, **checkpoints) -> SparkNetwork:
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=BATCH, num_workers=2, rng_seed=5, averaging_frequency=3, **checkpoints
        )
        spark_net = SparkNetwork(connect_spark, net, master, progress=False)
        spark_net.fit(df, epochs=epochs, run_id=checkpoints and "r1" or None)
        return spark_net

    reference = _interrupting()
    fit(reference)
    checkpoints = dict(checkpoint_directory=str(tmp_path / "ckpt"), checkpoint_every=1)
    with pytest.raises(WorkerError, match="worker stopped after 16 minibatches") as info:
        fit(_interrupting(after=16), **checkpoints)  # the 5th minibatch of epoch 2
    assert "--- executor traceback" in str(info.value) and "interrupting.py" in str(info.value)
    assert "SparkConnectGrpcException" not in str(info.value).splitlines()[0]
    cut = newest_checkpoint(checkpoints["checkpoint_directory"], "r1")
    done = [store.read_rank_file(cut.path, rank)[1]["done"] for rank in (0, 1)]
    assert cut.manifest["fit_epoch"] == 2 and 0 < done[0] == done[1] < per_worker

    resumed = _interrupting(after=per_worker - done[0])  # trains only what was left, or fails
    fit(resumed, **checkpoints)
    torch.testing.assert_close(resumed.params(), reference.params(), rtol=0, atol=1e-6)
    assert (resumed.iteration, resumed.epoch) == (reference.iteration, epochs)


def test_a_killed_worker_is_recovered_from_its_checkpoint(connect_spark, tmp_path) -> None:
    """SIGKILL rank 1's Python worker in epoch 1 (it reports its pid over the progress channel, which a local
    Connect server's executors reach): Spark fails the barrier stage, the fit retries it and completes."""
    data = datasets.synthetic_classification(128, 12, 3, seed=2)
    master = SharedTrainingMaster(
        batch_size_per_worker=BATCH,
        num_workers=2,
        rng_seed=0,
        collect_training_stats=True,
        rendezvous_timeout_s=30,
        max_failures=1,
        checkpoint_directory=str(tmp_path / "ckpt"),
        checkpoint_every=2,
    )
    net = _network()
    spark_net = SparkNetwork(connect_spark, net, master, progress=False)
    fault = Fault(signal.SIGKILL, epoch=1)
    spark_net.add_progress_listener(fault)
    spark_net.fit(frame(connect_spark, data), epochs=2)

    assert len(fault.hit) == 1
    assert net.epoch == 2
    summary = spark_net.training_stats.summary()
    [failure] = summary["failures"]
    assert failure["attempt"] == 0 and "Python worker exited unexpectedly" in failure["reason"]
    assert summary["recovered_from"]["attempt"] == 1 and summary["recovered_from"]["checkpoint"] is not None

    fault = Fault(signal.SIGKILL, epoch=0)
    spark_net = SparkNetwork(connect_spark, _network(), dataclasses.replace(master, max_failures=0), progress=False)
    spark_net.add_progress_listener(fault)
    with pytest.raises(WorkerLost, match="max_failures=0"):
        spark_net.fit(frame(connect_spark, data), epochs=1)


def test_early_stopping_trains_a_dataframe_epoch_by_epoch(connect_spark) -> None:
    from torchspark.earlystopping import EarlyStoppingConfiguration, LossCalculator, MaxEpochs
    from torchspark.spark.earlystopping import SparkEarlyStoppingTrainer

    data = datasets.synthetic_classification(64, 12, 3, seed=4)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=BATCH, num_workers=2, rng_seed=SEED)
    spark_net = SparkNetwork(connect_spark, _network(), master, progress=False)
    config = EarlyStoppingConfiguration(score_calculator=LossCalculator(data), epoch_conditions=[MaxEpochs(3)])
    result = SparkEarlyStoppingTrainer(spark_net, config, train_data=frame(connect_spark, data)).fit()
    assert result.total_epochs == 3 and spark_net.network.epoch == 3
    assert result.score_vs_epoch[2] < result.score_vs_epoch[0]  # it trained


def test_early_stopping_scores_on_the_cluster_under_connect(connect_spark) -> None:
    """The Spark score calculators take the Connect session (no SparkContext) and score a DataFrame there: the
    same scores a local calculator gives for the same weights."""
    from torchspark.earlystopping import (
        EarlyStoppingConfiguration,
        EvaluationCalculator,
        LossCalculator,
        MaxEpochs,
    )
    from torchspark.spark.earlystopping import (
        SparkEarlyStoppingTrainer,
        SparkEvaluationCalculator,
        SparkLossCalculator,
    )

    data = datasets.synthetic_classification(64, 12, 3, seed=4)
    validation = frame(connect_spark, data)
    loss = SparkLossCalculator(connect_spark, validation, batch_size=16)
    accuracy = SparkEvaluationCalculator(connect_spark, validation, "accuracy", batch_size=16)
    net = _network()
    assert loss.calculate(net) == pytest.approx(LossCalculator(data).calculate(net), rel=1e-5)
    assert accuracy.calculate(net) == EvaluationCalculator(data, "accuracy").calculate(net)

    master = ParameterAveragingTrainingMaster(batch_size_per_worker=BATCH, num_workers=2, rng_seed=SEED)
    spark_net = SparkNetwork(connect_spark, net, master, progress=False)
    config = EarlyStoppingConfiguration(score_calculator=loss, epoch_conditions=[MaxEpochs(2)])
    result = SparkEarlyStoppingTrainer(spark_net, config, train_data=validation).fit()
    assert result.total_epochs == 2
    assert result.score_vs_epoch[1] == pytest.approx(LossCalculator(data).calculate(spark_net.network), rel=1e-5)


def test_drop_last_and_the_default_worker_count(connect_spark) -> None:
    """Without ``num_workers`` the fit takes the cluster's default parallelism (``local[2]``: 2 workers);
    ``drop_last`` trains only full minibatches (100 examples, batches of 8: 96), as on a classic session."""
    data = datasets.synthetic_classification(100, 12, 3, seed=1)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=BATCH, drop_last=True)
    spark_net = SparkNetwork(connect_spark, _network(), master, progress=False)
    spark_net.fit(frame(connect_spark, data))
    assert [r.examples for r in spark_net.last_results] == [48, 48]


def test_the_in_process_runner_reads_connect_data_on_the_client(connect_spark) -> None:
    """``runner=InProcessRunner()`` (tests, debugging) trains the same per-worker minibatches in threads here."""
    from torchspark.training.driver.runner import InProcessRunner

    data = datasets.synthetic_classification(100, 12, 3, seed=1)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH, num_workers=2, rng_seed=SEED, averaging_frequency=3
    )
    threads, stage = _network(), _network()
    SparkNetwork(connect_spark, threads, master, progress=False, runner=InProcessRunner()).fit(
        frame(connect_spark, data), epochs=2
    )
    SparkNetwork(connect_spark, stage, master, progress=False).fit(frame(connect_spark, data), epochs=2)
    torch.testing.assert_close(threads.params(), stage.params(), atol=1e-5, rtol=1e-5)
