"""Evaluation and export on a Spark Connect session: DataFrames and batch files in, results equal to a local pass
over the same data; RDDs, lists, nulls and ragged arrays refused with messages that say what to do."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

from torchspark import DataSet, Network, datasets, models, optim
from torchspark.data import load_batch
from torchspark.errors import ConfigError, DataError
from torchspark.evaluation import ROC, Evaluation, RegressionEvaluation, ROCMultiClass
from torchspark.spark import SparkNetwork, export_batches
from torchspark.spark import evaluation as spark_eval
from torchspark.spark.shipped import ConnectNetwork, ship_to_session

N, F, C = 120, 6, 3


@pytest.fixture(scope="module")
def data() -> DataSet:
    return datasets.synthetic_classification(N, F, C, seed=1, noise=2.5)  # noisy: accuracy well below 1


@pytest.fixture(scope="module")
def net(data: DataSet) -> Network:
    return Network(models.mlp(F, 16, C), updater=optim.Adam(lr=1e-2), seed=0).fit(data, epochs=2, batch_size=32)


def frame_of(spark, data: DataSet, partitions: int = 2):
    rows = [(data.features[i].tolist(), int(data.labels[i]), i) for i in range(len(data))]
    return spark.createDataFrame(rows, "features array<double>, label long, id long").repartition(partitions)


@pytest.fixture(scope="module")
def df(connect_spark, data):
    return frame_of(connect_spark, data)


def test_every_evaluation_equals_local_on_a_dataframe(connect_spark, net, data, df) -> None:
    snet = SparkNetwork(connect_spark, net)
    assert snet.sc is None  # a Connect session has no SparkContext
    local = net.evaluate(data, batch_size=50)
    assert 0.4 < local.accuracy() < 1.0  # a meaningful confusion matrix
    got = snet.evaluate(df, batch_size=50)
    assert isinstance(got, Evaluation) and got.num_examples() == N
    np.testing.assert_array_equal(got.confusion_matrix(), local.confusion_matrix())
    ev, roc = snet.do_evaluation(df, Evaluation(), ROCMultiClass(32), batch_size=50)
    assert ev.accuracy() == local.accuracy()
    local_roc = net.evaluate(data, ROCMultiClass(32), batch_size=50)
    assert [roc.auc(c) for c in range(C)] == [local_roc.auc(c) for c in range(C)]
    assert snet.evaluate_roc_multi_class(df, batch_size=50).average_auc() == local_roc.average_auc()
    assert snet.calculate_score(df) == pytest.approx(net.score(data), rel=1e-6)
    assert snet.calculate_score(df, average=False) == pytest.approx(
        float(net.score_examples(data).double().sum()), rel=1e-6
    )


def test_binary_roc_and_regression_equal_local(connect_spark) -> None:
    binary = datasets.synthetic_classification(80, F, 2, seed=3, noise=3.0)
    bnet = Network(models.mlp(F, 8, 2), seed=1)
    got = SparkNetwork(connect_spark, bnet).evaluate_roc(frame_of(connect_spark, binary), batch_size=40)
    assert got.auc() == bnet.evaluate(binary, ROC(32), batch_size=40).auc()
    x = torch.randn(60, F, generator=torch.Generator().manual_seed(0))
    reg = DataSet(x, x[:, :2].sum(1, keepdim=True) + 0.1 * x[:, 2:3])
    rnet = Network(models.mlp(F, 8, 1), loss="mse", seed=2)
    rows = [(reg.features[i].tolist(), reg.labels[i].tolist()) for i in range(len(reg))]
    rdf = connect_spark.createDataFrame(rows, "features array<double>, label array<double>").repartition(3)
    dist = SparkNetwork(connect_spark, rnet).evaluate_regression(rdf)
    local = rnet.evaluate(reg, RegressionEvaluation())
    assert isinstance(dist, RegressionEvaluation)
    assert dist.mean_squared_error(0) == pytest.approx(local.mean_squared_error(0), rel=1e-5)
    assert dist.r_squared(0) == pytest.approx(local.r_squared(0), rel=1e-5)


def test_export_batches_writes_the_classic_format_and_evaluation_reads_it(
    connect_spark, net, data, df, tmp_path
) -> None:
    out = str(tmp_path / "batches")
    paths = export_batches(df, out, batch_size=32)
    names = [os.path.basename(p) for p in paths]
    assert all(re.fullmatch(r"(part\d{5}|rest)-[0-9a-f]{8}_\d{6}\.safetensors", n) for n in names), names
    assert sorted(os.listdir(out)) == sorted(names)  # the remainders' hidden files were merged and removed
    batches = [load_batch(p) for p in paths]
    assert [len(b) for b in batches[:-1]] == [32] * (len(batches) - 1) and sum(map(len, batches)) == N
    merged = DataSet.merge(batches)
    assert merged.labels.dtype == torch.int64 and merged.features.shape == (N, F)
    order = sorted(range(N), key=lambda i: merged.features[i].tolist())
    want = sorted(range(N), key=lambda i: data.features[i].tolist())
    torch.testing.assert_close(merged.features[order], data.features[want])
    torch.testing.assert_close(merged.labels[order], data.labels[want])
    local = net.evaluate(data, batch_size=50)
    snet = SparkNetwork(connect_spark, net)
    for source in (out, paths, os.path.join(out, "*.safetensors")):  # a directory, a list, a glob
        np.testing.assert_array_equal(snet.evaluate(source).confusion_matrix(), local.confusion_matrix())
    assert snet.calculate_score(paths) == pytest.approx(net.score(data), rel=1e-6)


def test_evaluation_with_a_loader_reads_files_on_the_executors(connect_spark, net, data, tmp_path) -> None:
    def _csv_loader(path: str) -> DataSet:  # nested: cloudpickle ships it by value (executors lack this module)
        rows = np.loadtxt(path, delimiter=",", ndmin=2)
        return DataSet(torch.tensor(rows[:, :-1], dtype=torch.float32), torch.tensor(rows[:, -1], dtype=torch.int64))

    for k, part in enumerate(data.split(50)):
        np.savetxt(
            tmp_path / f"shard{k}.csv", np.hstack([part.features.numpy(), part.labels[:, None].numpy()]), delimiter=","
        )
    got = SparkNetwork(connect_spark, net).evaluate(str(tmp_path), loader=_csv_loader)
    np.testing.assert_array_equal(got.confusion_matrix(), net.evaluate(data).confusion_matrix())


def test_a_network_over_the_closure_limit_travels_as_session_artifacts(connect_spark, data, df) -> None:
    big = Network(models.mlp(F, [3000, 3000], C), seed=3)  # 9M parameters: 36 MB, over the 32 MiB closure limit
    shipped = ship_to_session(connect_spark, big)
    assert isinstance(shipped, ConnectNetwork) and shipped.shipment.via_artifacts
    small = ship_to_session(connect_spark, Network(models.mlp(F, 4, C), seed=0))
    assert not small.shipment.via_artifacts  # type: ignore[attr-defined]
    got = spark_eval.evaluate(connect_spark, big, df, batch_size=60)
    np.testing.assert_array_equal(got.confusion_matrix(), big.evaluate(data, batch_size=60).confusion_matrix())


def test_rdds_and_lists_of_batches_are_refused_with_the_dataframe_route(connect_spark, net, data) -> None:
    from pyspark import RDD

    snet = SparkNetwork(connect_spark, net)
    rdd = object.__new__(RDD)  # the class alone: a Connect process cannot make a real RDD
    for call in (
        lambda d: snet.evaluate(d),
        lambda d: snet.calculate_score(d),
        lambda d: snet.score_examples(d),
        lambda d: snet.feed_forward_with_key(d),
        lambda d: snet.score_examples_with_key(d),
        lambda d: export_batches(d, "/tmp/never", 8),
    ):
        for bad in (rdd, data.split(40)):
            with pytest.raises(ConfigError, match="Spark Connect session .* no SparkContext or RDDs; pass a DataFrame"):
                call(bad)


def test_nulls_and_ragged_arrays_are_data_errors_naming_the_column(connect_spark, net, tmp_path) -> None:
    snet = SparkNetwork(connect_spark, net)
    nulls = connect_spark.createDataFrame([([0.0] * F, 1), (None, 0)], "features array<double>, label long")
    ragged = connect_spark.createDataFrame(
        [([0.0] * F, 1), ([0.0] * (F + 1), 0)], "features array<double>, label long"
    ).coalesce(1)
    null_label = connect_spark.createDataFrame(
        [([0.0] * F, 1), ([1.0] * F, None)], "features array<double>, label long"
    )
    for frame, match in (
        (nulls, "column 'features' has 1 null row"),
        (ragged, "arrays of different lengths"),
        (null_label, "column 'label' has 1 null value"),
    ):
        with pytest.raises(DataError, match=match):
            snet.evaluate(frame)
        with pytest.raises(DataError, match=match):
            snet.calculate_score(frame)
        with pytest.raises(DataError, match=match):
            export_batches(frame, str(tmp_path / "x"), 4)
    with pytest.raises(DataError, match=r"DataFrame has no column\(s\) \['pixels'\]"):
        snet.evaluate(nulls, features_col="pixels")


def test_an_empty_dataframe_is_a_data_error(connect_spark, net) -> None:
    empty = connect_spark.createDataFrame([], "features array<double>, label long")
    with pytest.raises(DataError, match="evaluation got no data"):
        SparkNetwork(connect_spark, net).evaluate(empty)
