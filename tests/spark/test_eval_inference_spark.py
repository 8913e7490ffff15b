"""Distributed evaluation and inference on a real local[2] Spark session, checked against the local network."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from torchspark import DataSet, Network, datasets, models, optim
from torchspark.data import Columns
from torchspark.errors import ConfigError, DataError
from torchspark.evaluation import ROC, Evaluation, RegressionEvaluation, ROCMultiClass
from torchspark.nn.cache import NetworkCache
from torchspark.spark import SparkNetwork, inference
from torchspark.spark import evaluation as spark_eval

N, F, C = 300, 6, 3


@pytest.fixture(scope="module")
def data() -> DataSet:
    return datasets.synthetic_classification(N, F, C, seed=1, noise=2.5)  # noisy: accuracy well below 1


@pytest.fixture(scope="module")
def net(data: DataSet) -> Network:
    network = Network(models.mlp(F, 16, C), updater=optim.Adam(lr=1e-2), seed=0, weight_decay=1e-3)
    return network.fit(data, epochs=3, batch_size=32)


@pytest.fixture(scope="module")
def rdd(sc, data: DataSet):
    # batches of 50 in 2 partitions (3 each); batch_size=50 on the executors keeps the local batching
    return sc.parallelize(data.split(50), 2)


# ------------------------------------------------------------------ evaluation
def test_evaluation_equals_local_exactly(sc, net, data, rdd) -> None:
    local = net.evaluate(data, batch_size=50)
    assert 0.4 < local.accuracy() < 1.0  # a meaningful confusion matrix, not a trivial one
    dist = spark_eval.evaluate(sc, net, rdd, batch_size=50)
    assert isinstance(dist, Evaluation)
    np.testing.assert_array_equal(dist.confusion_matrix(), local.confusion_matrix())
    assert dist.accuracy() == local.accuracy()
    assert dist.num_examples() == N


def test_roc_equals_local_exactly(sc, net, data, rdd) -> None:
    local = net.evaluate(data, ROCMultiClass(threshold_steps=32), batch_size=50)
    dist = spark_eval.do_evaluation(sc, net, rdd, ROCMultiClass(32), batch_size=50)
    assert dist.threshold_steps == 32
    for c in range(C):
        assert dist.auc(c) == local.auc(c)
    assert dist.average_auc() == local.average_auc()
    # binary ROC on a 2-class problem
    binary = datasets.synthetic_classification(120, F, 2, seed=3, noise=3.0)
    bnet = Network(models.mlp(F, 8, 2), seed=1)
    roc_local = bnet.evaluate(binary, ROC(32), batch_size=40)
    roc_dist = spark_eval.do_evaluation(sc, bnet, sc.parallelize(binary.split(40), 2), ROC(32), batch_size=40)
    assert roc_dist.auc() == roc_local.auc()
    assert 0.0 < roc_dist.auc() < 1.0


def test_several_evaluations_in_one_pass_equal_separate_passes(sc, net, rdd) -> None:
    ev, roc = spark_eval.do_evaluation(sc, net, rdd, Evaluation(), ROCMultiClass(32), batch_size=50)
    alone_ev = spark_eval.do_evaluation(sc, net, rdd, Evaluation(), batch_size=50)
    alone_roc = spark_eval.do_evaluation(sc, net, rdd, ROCMultiClass(32), batch_size=50)
    np.testing.assert_array_equal(ev.confusion_matrix(), alone_ev.confusion_matrix())
    assert [roc.auc(c) for c in range(C)] == [alone_roc.auc(c) for c in range(C)]
    # the merged result is added into the objects passed in
    mine = Evaluation()
    assert spark_eval.do_evaluation(sc, net, rdd, mine, batch_size=50) is mine
    assert mine.num_examples() == N


def test_odd_batch_sizes_stay_exact(sc, net, data) -> None:
    ragged = sc.parallelize(data.split(7), 3)  # re-batched on the executors
    local = net.evaluate(data, batch_size=50)
    dist = spark_eval.evaluate(sc, net, ragged, batch_size=50)
    np.testing.assert_array_equal(dist.confusion_matrix(), local.confusion_matrix())


def test_dataframe_and_path_inputs_equal_rdd_input(spark, sc, net, data, rdd, tmp_path) -> None:
    from torchspark import save_batches

    reference = spark_eval.evaluate(sc, net, rdd, batch_size=50).confusion_matrix()
    rows = [(data.features[i].tolist(), int(data.labels[i])) for i in range(N)]
    df = spark.createDataFrame(rows, "x array<float>, y int")
    from_df = spark_eval.evaluate(sc, net, df, batch_size=50, columns=Columns("x", "y"))
    np.testing.assert_array_equal(from_df.confusion_matrix(), reference)
    # the public methods take the flat keywords or one Columns value, not both
    snet = SparkNetwork(spark, net)
    flat = snet.evaluate(df, batch_size=50, features_col="x", label_col="y")
    np.testing.assert_array_equal(flat.confusion_matrix(), reference)
    np.testing.assert_array_equal(snet.evaluate(df, 50, columns=Columns("x", "y")).confusion_matrix(), reference)
    with pytest.raises(ConfigError, match=r"evaluate: columns=.*and features_col='x' both name the columns"):
        snet.evaluate(df, features_col="x", columns=Columns("x", "y"))

    paths = save_batches(data.split(50), str(tmp_path / "batches"))
    np.testing.assert_array_equal(spark_eval.evaluate(sc, net, paths, batch_size=50).confusion_matrix(), reference)
    np.testing.assert_array_equal(
        spark_eval.evaluate(sc, net, sc.parallelize(paths, 2), batch_size=50).confusion_matrix(), reference
    )


def test_regression_evaluation_matches_local(sc) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(90, 4, generator=g)
    y = x @ torch.randn(4, 2, generator=g) + 0.1 * torch.randn(90, 2, generator=g)
    reg = DataSet(x, y)
    rnet = Network(models.mlp(4, 8, 2), loss="mse", seed=0)
    local = rnet.evaluate(reg, RegressionEvaluation(), batch_size=30)
    dist = spark_eval.do_evaluation(sc, rnet, sc.parallelize(reg.split(30), 2), RegressionEvaluation(), batch_size=30)
    for col in range(2):
        assert dist.mean_squared_error(col) == pytest.approx(local.mean_squared_error(col), rel=1e-12)


# ------------------------------------------------------------------ inference and scoring
def test_feed_forward_with_key_every_key_once(sc, net, data) -> None:
    pairs = [(f"k{i}", data.features[i]) for i in range(N)]
    pairs[5] = ("k5", data.features[5].numpy())  # numpy values work too
    out = inference.feed_forward_with_key(sc, net, sc.parallelize(pairs, 3), batch_size=16).collect()
    keys = [k for k, _ in out]
    assert len(keys) == N and set(keys) == {f"k{i}" for i in range(N)}
    expected = net.output(data.features)
    got = torch.stack([dict(out)[f"k{i}"] for i in range(N)])
    assert got.shape == (N, C)
    torch.testing.assert_close(got, expected)


def test_score_examples_match_local_losses(sc, net, data, rdd) -> None:
    local = net.score_examples(data)
    got = torch.tensor(inference.score_examples(sc, net, rdd, batch_size=50).collect())
    torch.testing.assert_close(got, local)
    reg = inference.regularization_score(net)
    assert reg > 0
    with_reg = torch.tensor(inference.score_examples(sc, net, rdd, include_regularization=True).collect())
    torch.testing.assert_close(with_reg, local.double() + reg, check_dtype=False)

    keyed = sc.parallelize([(i, data.slice(i, i + 1)) for i in range(N)], 2)
    by_key = dict(inference.score_examples_with_key(sc, net, keyed, batch_size=32).collect())
    assert sorted(by_key) == list(range(N))
    torch.testing.assert_close(torch.tensor([by_key[i] for i in range(N)]), local)


def test_calculate_score_equals_local_mean_and_sum(sc, net, data, rdd) -> None:
    mean = inference.calculate_score(sc, net, rdd, batch_size=50)
    assert mean == pytest.approx(net.score(data), rel=1e-6)
    total = inference.calculate_score(sc, net, rdd, average=False, batch_size=50)
    assert total == pytest.approx(float(net.score_examples(data).double().sum()), rel=1e-6)


def test_predict_adds_correct_column(spark, net, data) -> None:
    rows = [(i, data.features[i].tolist()) for i in range(N)]
    df = spark.createDataFrame(rows, "id int, features array<float>").repartition(2)
    out = inference.predict(spark, net, df, batch_size=32)
    assert out.columns == ["id", "features", "prediction"]
    got = {r["id"]: r["prediction"] for r in out.select("id", "prediction").collect()}
    assert len(got) == N
    probs = torch.tensor([got[i] for i in range(N)])
    torch.testing.assert_close(probs, net.output(data.features))

    classes = inference.predict(spark, net, df, output_col="cls", output="class")
    got_cls = {r["id"]: r["cls"] for r in classes.select("id", "cls").collect()}
    assert [got_cls[i] for i in range(N)] == net.output(data.features).argmax(dim=1).tolist()


def test_predict_vector_column_and_feature_shape(spark) -> None:
    from pyspark.ml.linalg import Vectors

    images = datasets.synthetic_images(40, 1, 8, 8, n_classes=4, seed=0)
    cnn = Network(models.lenet(1, 4, 8, 8), seed=0)
    rows = [(Vectors.dense(images.features[i].reshape(-1).tolist()),) for i in range(40)]
    df = spark.createDataFrame(rows, ["img"]).coalesce(1)
    out = inference.predict(spark, cnn, df, Columns("img", None, (1, 8, 8))).collect()
    torch.testing.assert_close(torch.tensor([r["prediction"] for r in out]), cnn.output(images.features))
    flat = SparkNetwork(spark, cnn).predict(df, features_col="img", feature_shape=(1, 8, 8)).collect()
    torch.testing.assert_close(torch.tensor([r["prediction"] for r in flat]), cnn.output(images.features))


# ------------------------------------------------------------------ bad input
def test_predict_refuses_or_nulls_rows_with_nan_features(spark, sc, net, data) -> None:
    """A NaN/inf row used to get class 0 silently: now DataError (default) or a null prediction, every output."""
    rows = [(i, data.features[i].tolist()) for i in range(20)]
    rows[5] = (5, [float("nan")] + rows[5][1][1:])
    rows[11] = (11, rows[11][1][:3] + [float("inf")] + rows[11][1][4:])
    df = spark.createDataFrame(rows, "id int, features array<float>").coalesce(1)
    for output in ("class", "probabilities"):
        with pytest.raises(Exception, match=r"features column 'features'.*have NaN or inf features.*non_finite='null'"):
            inference.predict(spark, net, df, output=output).collect()
    want = net.output(data.features[:20])
    kept = [i for i in range(20) if i not in (5, 11)]
    probs = {r["id"]: r["prediction"] for r in inference.predict(spark, net, df, non_finite="null").collect()}
    assert probs[5] is None and probs[11] is None
    torch.testing.assert_close(torch.tensor([probs[i] for i in kept]), want[kept])
    classes = {
        r["id"]: r["c"]
        for r in inference.predict(spark, net, df, Columns(), "c", output="class", non_finite="null").collect()
    }
    assert classes[5] is None and classes[11] is None
    assert [classes[i] for i in kept] == want[kept].argmax(dim=1).tolist()
    with pytest.raises(ConfigError, match=r"non_finite must be one of \['error', 'null'\], got 'drop'"):
        inference.predict(spark, net, df, non_finite="drop")
    keyed = sc.parallelize([(f"k{i}", data.features[i].clone()) for i in range(6)], 1)
    poisoned = keyed.map(lambda kv: (kv[0], kv[1] * float("nan")) if kv[0] == "k4" else kv)
    with pytest.raises(Exception, match=r"the first is key .k4."):
        inference.feed_forward_with_key(sc, net, poisoned).collect()
    outs = dict(inference.feed_forward_with_key(sc, net, poisoned, non_finite="null").collect())
    assert bool(outs["k4"].isnan().all()) and bool(torch.isfinite(outs["k3"]).all())


def test_empty_data_is_a_data_error(sc, net) -> None:
    empty = sc.parallelize([], 2)
    with pytest.raises(DataError, match="no data"):
        spark_eval.evaluate(sc, net, empty)
    with pytest.raises(DataError, match="no data"):
        inference.calculate_score(sc, net, empty)
    with pytest.raises(DataError, match="empty"):
        spark_eval.evaluate(sc, net, [])


def test_wrong_columns_name_the_column(spark, sc, net) -> None:
    df = spark.createDataFrame([([1.0] * F, 0)], "x array<float>, y int")
    with pytest.raises(DataError, match="'features'"):
        spark_eval.evaluate(sc, net, df)
    with pytest.raises(DataError, match="'nope'"):
        inference.predict(spark, net, df, Columns("nope"))
    with pytest.raises(ConfigError, match="output must be one of"):
        inference.predict(spark, net, df, Columns("x"), output="logits")


def test_executor_data_errors_come_back_as_data_errors(sc, net) -> None:
    bad = DataSet(torch.rand(8, F), torch.full((8,), 7, dtype=torch.long))
    with pytest.raises(DataError, match="label index 7") as info:
        spark_eval.evaluate(sc, net, sc.parallelize([bad], 1))
    assert "executor traceback" in str(info.value)
    with pytest.raises(ConfigError, match="at least one evaluation"):
        spark_eval.do_evaluation(sc, net, sc.parallelize([bad], 1))
    two = sc.parallelize([(0, DataSet(torch.rand(2, F), torch.zeros(2, dtype=torch.long)))], 1)
    with pytest.raises(Exception, match="holds 2 examples"):
        inference.score_examples_with_key(sc, net, two).collect()


# ------------------------------------------------------------------ the per-process cache, without Spark
def test_network_cache_bounds_copies_and_reuses_them() -> None:
    cache = NetworkCache(max_keys=2)
    built: list[Network] = []

    def build() -> Network:
        net = Network(models.mlp(2, 2, 2), seed=0)
        built.append(net)
        return net

    with cache.lease("a", 2, build) as first:
        pass
    with cache.lease("a", 2, build) as again:
        assert again is first  # a later task in the same process reuses the copy
    assert cache.copies("a") == 1

    holders, peak, lock = [0], [0], threading.Lock()

    def task() -> None:
        with cache.lease("b", 2, build):
            with lock:
                holders[0] += 1
                peak[0] = max(peak[0], holders[0])
            time.sleep(0.02)
            with lock:
                holders[0] -= 1

    threads = [threading.Thread(target=task) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] <= 2
    assert 1 <= cache.copies("b") <= 2  # never more copies than the cache's limit

    with cache.lease("c", 2, build):
        pass
    assert cache.keys() == ["b", "c"]  # oldest key evicted
    assert cache.copies("a") == 0
    with pytest.raises(ConfigError, match="max_keys"):
        NetworkCache(max_keys=0)


def test_executor_processes_build_one_copy_each(sc, net) -> None:
    """With Python worker reuse, later tasks in a process lease the copy an earlier task built."""
    import os

    from torchspark.spark.shipped import ship_network

    shipped = ship_network(sc, net)

    def probe(items):
        from torchspark.spark.shipped import _CACHE  # the executor process's own cache

        with shipped.lease(1) as copy:
            copy.output(torch.zeros(1, F))
        yield os.getpid(), _CACHE.copies(shipped.key)

    try:
        seen = sc.parallelize(range(8), 8).mapPartitions(probe).collect()
    finally:
        shipped.release()
    assert len(seen) == 8
    assert all(copies == 1 for _, copies in seen), seen
    assert len({pid for pid, _ in seen}) < 8  # processes were reused, so the copies were too


# ------------------------------------------------------------------ the same API on SparkNetwork
def test_spark_network_methods_equal_local_results(spark, net, data, rdd) -> None:
    snet = SparkNetwork(spark, net)
    local = net.evaluate(data, batch_size=50)
    np.testing.assert_array_equal(snet.evaluate(rdd, batch_size=50).confusion_matrix(), local.confusion_matrix())
    ev, roc = snet.do_evaluation(rdd, Evaluation(), ROCMultiClass(32), batch_size=50)
    assert ev.accuracy() == local.accuracy()
    assert roc.average_auc() == net.evaluate(data, ROCMultiClass(32), batch_size=50).average_auc()
    assert snet.evaluate_roc_multi_class(rdd, batch_size=50).average_auc() == roc.average_auc()
    assert snet.calculate_score(rdd, batch_size=50) == pytest.approx(net.score(data), rel=1e-5)
    losses = snet.score_examples(rdd, batch_size=50).collect()
    assert len(losses) == N and np.mean(losses) == pytest.approx(net.score(data), rel=1e-5)
    keyed = snet.feed_forward_with_key(
        spark.sparkContext.parallelize([(i, data.features[i]) for i in range(10)], 2)
    ).collectAsMap()
    torch.testing.assert_close(keyed[3], net.output(data.features[3:4])[0])
    df = spark.createDataFrame([(data.features[i].tolist(), i) for i in range(20)], ["features", "id"])
    got = {r["id"]: r["prediction"] for r in snet.predict(df, output="class").collect()}
    want = net.output(data.features[:20]).argmax(1).tolist()
    assert [got[i] for i in range(20)] == want


def test_ctrl_c_cancels_an_evaluation_job(sc) -> None:
    """Evaluation and inference jobs run in their own job group: Ctrl-C cancels the Spark job, not only Python."""
    from ctrl_c import assert_ctrl_c_cancels, never_ending_job
    from torchspark.spark.jobs import run_job

    job = never_ending_job(sc)
    assert_ctrl_c_cancels(
        sc,
        lambda: run_job(sc, "test: an evaluation that only ends when cancelled", job, "torchspark-eval-job"),
        "evaluation",
    )
