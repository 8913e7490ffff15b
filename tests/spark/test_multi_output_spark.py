"""Multi-output and multi-input all the way: distributed evaluation per output (or one chosen by index),
DataFrames with several feature and label columns, and prediction of any output."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from torchspark import Network, optim
from torchspark.data import MultiDataSet
from torchspark.errors import ConfigError
from torchspark.evaluation import Evaluation, RegressionEvaluation
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork


def _two_head() -> Network:
    class TwoHead(nn.Module):  # defined here: shipped to the executors by value
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 16)
            self.b = nn.Linear(2, 16)
            self.cls = nn.Linear(16, 2)
            self.reg = nn.Linear(16, 1)

        def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = torch.relu(self.a(x1) + self.b(x2))
            return self.cls(h), self.reg(h)

    return Network(TwoHead(), loss=["cross_entropy", "mse"], updater=optim.Adam(lr=1e-2), seed=0)


def _data(n: int = 120) -> MultiDataSet:
    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(n, 3, generator=g), torch.randn(n, 2, generator=g)
    return MultiDataSet([x1, x2], [(x1[:, 0] > 0).long(), x2[:, :1] * 2.0])


def test_evaluate_fills_one_evaluation_per_output_or_the_chosen_one(spark, sc) -> None:
    net, data = _two_head(), _data()
    spark_net = SparkNetwork(spark, net)
    rdd = sc.parallelize(data.split(25), 3)
    both = spark_net.evaluate(rdd)
    assert isinstance(both, list) and isinstance(both[0], Evaluation) and isinstance(both[1], RegressionEvaluation)
    local = net.evaluate(data)
    assert (
        both[0].accuracy() == local[0].accuracy()
        and both[0].confusion_matrix().tolist() == local[0].confusion_matrix().tolist()
    )
    np.testing.assert_allclose(both[1].mean_squared_error(0), local[1].mean_squared_error(0), rtol=1e-5)
    second = spark_net.evaluate(rdd, output_index=1)
    np.testing.assert_allclose(second.mean_squared_error(0), local[1].mean_squared_error(0), rtol=1e-5)
    chosen = spark_net.do_evaluation(rdd, RegressionEvaluation(), output_index=1)
    np.testing.assert_allclose(chosen.mean_squared_error(0), local[1].mean_squared_error(0), rtol=1e-5)
    first = spark_net.do_evaluation(rdd, Evaluation())  # output 0, as before
    assert first.accuracy() == local[0].accuracy()
    with pytest.raises(ConfigError, match="output_index=2 but the network has 2 outputs"):
        spark_net.evaluate(rdd, output_index=2)


def test_dataframe_with_several_feature_and_label_columns_trains_evaluates_and_predicts(spark) -> None:
    data = _data(160)
    x1, x2 = data.features
    cls, reg = data.labels
    rows = [(i, x1[i].tolist(), x2[i].tolist(), int(cls[i]), reg[i].tolist()) for i in range(len(data))]
    df = spark.createDataFrame(
        rows, "id long, x1 array<float>, x2 array<float>, cls long, reg array<float>"
    ).repartition(3)
    net = _two_head()
    before = net.score(data)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2, num_workers=2)
    spark_net = SparkNetwork(spark, net, master, progress=False)
    cols = {"features_col": ["x1", "x2"], "label_col": ["cls", "reg"]}
    spark_net.fit(df, epochs=4, **cols)
    spark_net.delete_temp_files()
    assert sum(r.examples for r in spark_net.last_results) == 160 * 4
    assert net.score(data) < 0.7 * before

    evals = spark_net.evaluate(df, **cols)
    local = net.evaluate(data)
    assert evals[0].accuracy() == local[0].accuracy()
    np.testing.assert_allclose(evals[1].mean_squared_error(0), local[1].mean_squared_error(0), rtol=1e-4)

    out = spark_net.predict(df, features_col=["x1", "x2"], output_index=1).select("id", "prediction").collect()
    got = {r["id"]: r["prediction"][0] for r in out}
    expected = net.output([x1, x2])[1][:, 0]
    assert sorted(got) == list(range(len(data)))
    for i in range(len(data)):
        assert got[i] == pytest.approx(float(expected[i]), rel=1e-4, abs=1e-5)
