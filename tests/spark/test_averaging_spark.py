"""Parameter averaging on a real local[2] Spark session with real torch."""

from __future__ import annotations

import os
import re
import threading
from functools import partial

import numpy as np
import pytest
import torch

from helpers import lenet_net, mlp_net, uniform_data
from torchspark import DataSet, Network, datasets, models, optim
from torchspark.errors import ConfigError, DataError, SetupError, WorkerError
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork


def test_digits_lenet_reaches_95_percent(spark, sc) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=5, rng_seed=0)
    spark_net = SparkNetwork(spark, net, master)
    spark_net.fit(sc.parallelize(train.split(64), 4), epochs=8)
    accuracy = net.evaluate(test).accuracy()
    assert accuracy >= 0.95, accuracy
    assert net.epoch == 8
    assert np.isfinite(spark_net.score)
    spark_net.delete_temp_files()


@pytest.mark.parametrize("approach", ["export", "direct"])
def test_identical_shards_equal_single_worker(spark, sc, approach: str) -> None:
    """N workers on identical shards with plain SGD reproduce one worker (catches wrong averaging divisors)."""
    batches = uniform_data(90).split(10)  # 9 minibatches; averaging_frequency=4 leaves a partial last round
    rdd = sc.parallelize([b for _ in range(2) for b in batches], 2)  # partition i = the same 9 batches
    net = Network(models.mlp(64, 16, 10), updater=optim.SGD(lr=0.1), seed=3)
    reference = net.copy()
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=10,
        averaging_frequency=4,
        repartition="never",
        rdd_training_approach=approach,
        num_workers=2,
    )
    SparkNetwork(spark, net, master).fit(rdd, epochs=2)
    reference.fit(batches, epochs=2)
    torch.testing.assert_close(net.params(), reference.params(), atol=1e-5, rtol=0)


def _averaging_reference(
    module: torch.nn.Module, shards: list[list[DataSet]], lr: float, frequency: int
) -> tuple[list[float], torch.nn.Module]:
    """Parameter averaging as a plain torch loop: every replica takes up to ``frequency`` SGD steps on its own
    shard from the common parameters, then all take the example-weighted mean of the replicas that trained in the
    round (a replica whose shard ran out sits the round out). Returns each replica's last minibatch loss (taken
    before its last step, as a training step reports it) and the averaged module."""
    import copy

    import torch.nn.functional as F

    replicas = [copy.deepcopy(module) for _ in shards]
    last = [float("nan")] * len(shards)
    for start in range(0, max(len(shard) for shard in shards), frequency):
        weights = []
        for i, (replica, shard) in enumerate(zip(replicas, shards)):
            opt = torch.optim.SGD(replica.parameters(), lr=lr)
            weights.append(sum(len(b) for b in shard[start : start + frequency]))
            for batch in shard[start : start + frequency]:
                loss = F.cross_entropy(replica(batch.features), batch.labels)
                last[i] = float(loss.detach())
                opt.zero_grad()
                loss.backward()
                opt.step()
        with torch.no_grad():
            for params in zip(*(r.parameters() for r in replicas)):
                mean = sum(p * w for p, w in zip(params, weights)) / sum(weights)
                for p in params:
                    p.copy_(mean)
    return last, replicas[0]


@pytest.mark.parametrize("via", ["torch", "spark"])
def test_score_is_the_mean_of_the_workers_last_minibatch_loss(spark, sc, via: str) -> None:
    """Two workers, averaging every 2 minibatches of 8: worker 0 has three, worker 1 one. Round 1 averages 2:1,
    round 2 is worker 0's alone. score is the plain mean of each worker's own last minibatch loss (worker
    1's from round 1), computed by a plain torch loop: not the last round's score, not weighted by examples."""
    shards = [uniform_data(24, seed=20).split(8), uniform_data(8, seed=21).split(8)]  # different data: different losses
    net = Network(models.mlp(64, 16, 10), updater=optim.SGD(lr=0.1), seed=7)
    losses, reference = _averaging_reference(net.copy().module, shards, lr=0.1, frequency=2)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8,
        averaging_frequency=2,
        num_workers=2,
        repartition="never",
        rdd_training_approach="direct",
        averaging_via=via,
    )
    snet = SparkNetwork(spark, net, master, progress=False)
    assert np.isnan(snet.score), "NaN before any fit"
    snet.fit(sc.parallelize([shards[0], shards[1]], 2).flatMap(lambda shard: shard))  # partition i = shard i
    snet.delete_temp_files()
    assert losses[0] != pytest.approx(losses[1], rel=1e-3), "the workers' losses must differ to test the mean"
    assert snet.score == pytest.approx(sum(losses) / 2, rel=1e-5, abs=1e-6)
    assert [r.examples for r in snet.last_results] == [24, 8]
    reference_params = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    torch.testing.assert_close(net.params(), reference_params, atol=1e-5, rtol=0)


def test_export_and_direct_give_same_parameters(spark, sc) -> None:
    data = uniform_data(200, seed=1)
    rdd = sc.parallelize(data.split(7), 3)  # odd sizes: both routes must re-batch identically
    results = []
    for approach in ("export", "direct"):
        net = Network(models.mlp(64, 16, 10), updater=optim.SGD(lr=0.05, momentum=0.9), seed=5)
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=16, averaging_frequency=2, rng_seed=11, rdd_training_approach=approach, num_workers=2
        )
        spark_net = SparkNetwork(spark, net, master)
        spark_net.fit(rdd, epochs=2)
        spark_net.delete_temp_files()
        results.append(net.params())
    torch.testing.assert_close(results[0], results[1], atol=0, rtol=0)


def test_balanced_repartition_equal_counts_and_skew_finishes(spark, sc) -> None:
    big, small = uniform_data(220, seed=2), uniform_data(22, seed=3)
    skewed = sc.parallelize([big, small], 2)  # one partition 10x larger
    for repartition in ("always", "never"):
        net = Network(models.mlp(64, 8, 10), updater=optim.SGD(lr=0.05), seed=0)
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=11, averaging_frequency=3, repartition=repartition, num_workers=2
        )
        spark_net = SparkNetwork(spark, net, master)
        spark_net.fit(skewed, epochs=1)
        counts = sorted(r.examples for r in spark_net.last_results)
        if repartition == "always":
            assert counts == [121, 121], counts  # 22 minibatches of 11 -> 11 each
        else:
            assert counts == [22, 220], counts  # each worker its own partition; the short one waits, no hang
        assert torch.isfinite(net.params()).all()
        spark_net.delete_temp_files()


def test_dataframe_input_trains_like_rdd_input(spark, sc) -> None:
    data = uniform_data(160, seed=4)
    flat = data.features.reshape(160, 64).numpy()
    rows = [(flat[i].tolist(), int(data.labels[i])) for i in range(160)]
    df = spark.createDataFrame(rows, "features array<float>, label int").coalesce(1)
    rdd = sc.parallelize([data], 1)
    params = []
    for source, kwargs in ((df, {"feature_shape": (1, 8, 8)}), (rdd, {})):
        net = Network(models.lenet(1, 10, 8, 8), updater=optim.SGD(lr=0.05), seed=2)
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=16, averaging_frequency=2, num_workers=2, rdd_training_approach="direct"
        )
        SparkNetwork(spark, net, master).fit(source, epochs=1, **kwargs)
        params.append(net.params())
    torch.testing.assert_close(params[0], params[1], atol=1e-6, rtol=0)


def test_dataframe_vector_column_and_fit_paths(spark, sc, tmp_path) -> None:
    from pyspark.ml.linalg import Vectors

    from torchspark import save_batches

    data = datasets.synthetic_classification(200, 6, 3, seed=0)
    rows = [(Vectors.dense(data.features[i].tolist()), float(data.labels[i])) for i in range(200)]
    df = spark.createDataFrame(rows, ["vec", "y"])
    net = Network(models.mlp(6, 16, 3), updater=optim.Adam(lr=1e-2), seed=0)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2, num_workers=2)
    SparkNetwork(spark, net, master).fit(df, epochs=5, features_col="vec", label_col="y")
    assert net.evaluate(data).accuracy() > 0.85

    paths = save_batches(data.split(20), str(tmp_path / "batches"))
    net2 = Network(models.mlp(6, 16, 3), updater=optim.Adam(lr=1e-2), seed=0)
    spark_net = SparkNetwork(spark, net2, master)
    spark_net.fit_paths(paths, epochs=5)
    assert net2.evaluate(data).accuracy() > 0.85
    spark_net.fit_paths(sc.parallelize(paths, 2), epochs=1)


def test_save_updater_false_resets_state(spark, sc) -> None:
    net = Network(models.mlp(64, 8, 10), updater=optim.Adam(lr=1e-3), seed=0)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, save_updater=False, num_workers=2)
    SparkNetwork(spark, net, master).fit(sc.parallelize([uniform_data(64)], 2), epochs=1)
    assert torch.count_nonzero(net.updater_state()) == 0
    net_keep = Network(models.mlp(64, 8, 10), updater=optim.Adam(lr=1e-3), seed=0)
    SparkNetwork(spark, net_keep, ParameterAveragingTrainingMaster(batch_size_per_worker=16, num_workers=2)).fit(
        sc.parallelize([uniform_data(64)], 2), epochs=1
    )
    assert torch.count_nonzero(net_keep.updater_state()) > 0


# ------------------------------------------------------------------ bad input fails fast
_net = partial(mlp_net, 64, 8, 10)


def _master(**kw) -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(batch_size_per_worker=8, num_workers=2, **kw)


def test_empty_rdd(spark, sc) -> None:
    with pytest.raises(DataError, match="empty"):
        SparkNetwork(spark, _net(), _master()).fit(sc.parallelize([], 2))
    with pytest.raises(DataError, match="empty"):
        SparkNetwork(spark, _net(), _master(rdd_training_approach="direct")).fit(sc.parallelize([], 2))


def test_wrong_feature_shape(spark, sc) -> None:
    bad = DataSet(torch.rand(16, 1, 5, 5), torch.zeros(16, dtype=torch.long))
    with pytest.raises(DataError, match=r"\(4, 1, 5, 5\)"):
        SparkNetwork(spark, _net(), _master()).fit(sc.parallelize([bad], 2))


@pytest.mark.parametrize(
    "approach, strategy",
    [("export", "balanced"), ("export", "spark_default"), ("direct", "balanced"), ("direct", "spark_default")],
)
def test_bad_dataframe_and_rdd_items_raise_data_error_on_the_driver(
    spark, sc, tmp_path, approach: str, strategy: str
) -> None:
    """Bad data found on the executors (a feature_shape that does not fit the rows, an RDD of tuples) raises
    DataError naming it, not a raw Spark exception; a failed export leaves no files behind."""
    df = spark.createDataFrame([([0.5] * 64, i % 10) for i in range(32)], "features array<float>, label int")
    export_dir = tmp_path / "export"
    master = _master(rdd_training_approach=approach, repartition_strategy=strategy, export_directory=str(export_dir))
    with pytest.raises(DataError, match=r"64 values to feature_shape=\(1, 5, 5\); fix feature_shape"):
        SparkNetwork(spark, _lenet(), master, progress=False).fit(df, feature_shape=(1, 5, 5))
    with pytest.raises(DataError, match="the RDD holds a tuple; expected DataSet"):
        SparkNetwork(spark, _lenet(), master, progress=False).fit(sc.parallelize([(1, 2)] * 4, 2))
    assert not export_dir.exists() or not any(export_dir.iterdir()), sorted(export_dir.rglob("*"))


_lenet = partial(lenet_net, updater=optim.SGD(lr=0.1))


def test_label_out_of_range(spark, sc) -> None:
    bad = DataSet(torch.rand(16, 1, 8, 8), torch.full((16,), 12, dtype=torch.long))
    with pytest.raises(DataError, match="label index 12"):
        SparkNetwork(spark, _net(), _master(rdd_training_approach="direct")).fit(sc.parallelize([bad], 2))


def test_unwritable_export_directory(spark, sc, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(DataError, match="a-file"):
        SparkNetwork(spark, _net(), _master(export_directory=str(blocker / "sub"))).fit(
            sc.parallelize([uniform_data(16)], 2)
        )


def test_more_workers_than_slots(spark, sc) -> None:
    with pytest.raises(SetupError, match="num_workers=3 .* 2 task slot"):
        SparkNetwork(spark, _net(), _master().__class__(num_workers=3)).fit(sc.parallelize([uniform_data(32)], 2))


def test_repartition_never_needs_matching_partitions(spark, sc) -> None:
    with pytest.raises(ConfigError, match="3 partitions and num_workers=2"):
        SparkNetwork(spark, _net(), _master(repartition="never")).fit(sc.parallelize([uniform_data(16)] * 3, 3))


def _torchspark_shm_files() -> set[str]:
    """Shared-memory segments and FIFOs in /dev/shm (``torchspark-<pid>-*``, ``torchspark-fifo-<pid>-*``)."""
    from torchspark.training.comm.shm import SHM_DIR

    return {n for n in os.listdir(SHM_DIR) if n.startswith("torchspark-")} if os.path.isdir(SHM_DIR) else set()


def _descendants(root: int) -> set[int]:
    """Process ids below ``root`` now (Linux /proc): this test's JVM, its Python daemon and workers."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
        except (ValueError, OSError, IndexError):  # not a process, or it ended meanwhile
            continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _owner_pid(name: str) -> int:
    return int(re.match(r"torchspark-(?:fifo-)?(\d+)-", name).group(1))  # type: ignore[union-attr]


def test_worker_error_surfaces_traceback_and_cleans_up(spark, sc) -> None:
    """After a worker fails mid-fit: no Spark job left running, no torchspark thread on the driver, no shared-memory
    segment or FIFO left in /dev/shm by this session's workers, and the next fit in the session trains."""
    # the first minibatch is fine (driver check passes); a later one carries NaN -> the worker raises mid-fit
    good = uniform_data(32)
    x = torch.rand(32, 1, 8, 8)
    x[5] = float("nan")
    poisoned = DataSet(x, torch.zeros(32, dtype=torch.long))
    # big enough (38,922 parameters >= shm.MIN_NUMEL) that the averaging sums go through a shared-memory segment
    net = Network(models.mlp(64, 512, 10), seed=0)
    before = {t.name for t in threading.enumerate()}
    shm_before = _torchspark_shm_files()
    # other sessions on this machine may use /dev/shm too: watch which processes are ours during the fit
    ours, stop = _descendants(os.getpid()), threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            ours.update(_descendants(os.getpid()))

    watcher = threading.Thread(target=watch, name="test-process-watch", daemon=True)
    watcher.start()
    try:
        with pytest.raises(WorkerError, match="NaN at example 5") as info:
            SparkNetwork(spark, net, _master(rdd_training_approach="direct", repartition="never")).fit(
                sc.parallelize([good, poisoned], 2)
            )
    finally:
        stop.set()
        watcher.join()
    assert "Traceback" in str(info.value)
    assert not sc.statusTracker().getActiveJobsIds(), "the failed fit left a Spark job running"
    assert not sc.statusTracker().getActiveStageIds(), "the failed fit left a Spark stage running"
    leftover = {t.name for t in threading.enumerate()} - before
    assert not [n for n in leftover if n.startswith("torchspark")], leftover
    ours.update(_descendants(os.getpid()))
    leaked = [n for n in _torchspark_shm_files() - shm_before if _owner_pid(n) in ours]
    assert not leaked, f"segments/FIFOs of the failed fit left in /dev/shm: {leaked}"
    # the next fit in the same session trains: fresh or reused Python workers carry no stale process group,
    # segment or FIFO of the failed one
    net = Network(models.mlp(64, 512, 10), seed=0)
    start = net.params()
    snet = SparkNetwork(spark, net, _master(rdd_training_approach="direct", repartition="never"), progress=False)
    snet.fit(sc.parallelize([good, uniform_data(32, seed=9)], 2))
    assert sorted(r.examples for r in snet.last_results) == [32, 32]
    assert torch.isfinite(net.params()).all() and not torch.equal(net.params(), start)
    snet.delete_temp_files()


def test_ctrl_c_cancels_the_job_and_cleans_up(spark, sc) -> None:
    import _thread
    import time

    data = uniform_data(960, seed=3)
    spark_net = SparkNetwork(spark, _net(), _master(averaging_frequency=1), progress=False)
    interrupted = threading.Event()

    def press_ctrl_c(update) -> None:  # called on a driver thread while the workers train
        if not interrupted.is_set():
            interrupted.set()
            _thread.interrupt_main()

    spark_net.add_progress_listener(press_ctrl_c)
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(KeyboardInterrupt):
        spark_net.fit(sc.parallelize(data.split(96), 2), epochs=50)
    assert interrupted.is_set()
    deadline = time.monotonic() + 60
    while sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not sc.statusTracker().getActiveJobsIds(), "the training job kept running after Ctrl-C"
    leftover = {t.name for t in threading.enumerate()} - before
    assert not [n for n in leftover if n.startswith("torchspark")], leftover
    assert sc.parallelize(range(4), 2).sum() == 6


def test_master_json_round_trip_and_validation() -> None:
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=32, averaging_frequency=3, rng_seed=4, repartition="never", rdd_training_approach="direct"
    )
    assert ParameterAveragingTrainingMaster.from_json(master.to_json()) == master
    for bad, match in [
        ({"batch_size_per_worker": 0}, "batch_size_per_worker must be an integer >= 1, got 0"),
        ({"averaging_frequency": -1}, "averaging_frequency"),
        ({"repartition": "sometimes"}, "repartition must be one of"),
        ({"rdd_training_approach": "stream"}, "rdd_training_approach"),
        ({"rendezvous_timeout_s": 0}, "rendezvous_timeout_s"),
    ]:
        with pytest.raises(ConfigError, match=match):
            ParameterAveragingTrainingMaster(**bad)


def test_averaging_routes_are_validated() -> None:
    assert ParameterAveragingTrainingMaster(averaging_via="spark").averaging_via == "spark"  # implemented
    with pytest.raises(ConfigError, match=r"averaging_via must be one of \['torch', 'spark'\], got 'mpi'"):
        ParameterAveragingTrainingMaster(averaging_via="mpi")
    with pytest.raises(ConfigError, match="aggregation_depth must be an integer >= 1, got 0"):
        ParameterAveragingTrainingMaster(averaging_via="spark", aggregation_depth=0)
