"""``TorchEstimator`` / ``TorchModel`` in a ``pyspark.ml.Pipeline`` on a Spark Connect session: fit (through the
Connect training route), transform, save (with overwrite) and load, next to Spark's own stages."""

from __future__ import annotations

import os

import pytest
import torch
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import StandardScaler, VectorAssembler

from torchspark import Network, datasets, models
from torchspark.nn.network_spec import NetworkSpec
from torchspark.spark import ParameterAveragingTrainingMaster
from torchspark.spark.ml import TorchEstimator, TorchModel

N, F, C = 128, 4, 3
SPEC = NetworkSpec("mlp", {"n_in": F, "hidden": 16, "n_out": C}, updater={"type": "sgd", "lr": 0.1}, seed=0)
MASTER = ParameterAveragingTrainingMaster(batch_size_per_worker=16, num_workers=2, averaging_frequency=2, rng_seed=0)
COLUMNS = [f"f{i}" for i in range(F)]


@pytest.fixture(scope="module")
def data():
    return datasets.synthetic_classification(N, F, C, seed=4, noise=1.0)


@pytest.fixture(scope="module")
def df(connect_spark, data):
    rows = [(*map(float, x.tolist()), float(y)) for x, y in zip(data.features, data.labels)]
    return connect_spark.createDataFrame(rows, COLUMNS + ["label"]).repartition(2)


def _rows(frame) -> list[tuple[float, list[float]]]:
    return sorted(
        (r["prediction"], r["probability"].toArray().tolist())
        for r in frame.select("prediction", "probability").collect()
    )


def test_pipeline_fit_transform_save_load_round_trip(connect_spark, df, tmp_path) -> None:
    est = TorchEstimator(network=SPEC.to_json(), trainingMaster=MASTER.to_json(), epochs=3, featuresCol="scaled")
    pipeline = Pipeline(
        stages=[
            VectorAssembler(inputCols=COLUMNS, outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="scaled"),
            est,
        ]
    )
    model = pipeline.fit(df)
    torch_model = model.stages[-1]
    assert isinstance(torch_model, TorchModel) and torch_model.network.iteration > 0  # trained
    before = _rows(model.transform(df))
    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    model.write().overwrite().save(path)  # overwrite on a Connect session too
    saved = os.listdir(os.path.join(path, "stages"))
    network_dir = os.path.join(path, "stages", next(s for s in saved if "TorchModel" in s), "network")
    assert sorted(os.listdir(network_dir)) == ["config.json", "weights.safetensors"]  # no pickle
    loaded = PipelineModel.load(path)
    assert _rows(loaded.transform(df)) == before
    pipeline.write().overwrite().save(str(tmp_path / "pipeline"))
    stages = Pipeline.load(str(tmp_path / "pipeline")).getStages()
    assert isinstance(stages[-1], TorchEstimator) and stages[-1].getEpochs() == 3
    assert stages[-1].getFeaturesCol() == "scaled"


def test_transform_equals_the_local_network_and_a_model_saves_alone(connect_spark, data, df, tmp_path) -> None:
    net = Network(models.mlp(F, 8, C), seed=5)
    model = TorchModel(net)
    model.set(model.featuresCol, "raw")
    assembled = VectorAssembler(inputCols=COLUMNS, outputCol="raw").transform(df)
    got = model.transform(assembled).select(*COLUMNS, "prediction", "probability").collect()
    x = torch.tensor([[r[c] for c in COLUMNS] for r in got], dtype=torch.float32)
    want = net.output(x)
    torch.testing.assert_close(
        torch.tensor([r["probability"].toArray().tolist() for r in got], dtype=torch.float32), want
    )
    assert [r["prediction"] for r in got] == [float(c) for c in want.argmax(1).tolist()]
    path = str(tmp_path / "alone")
    model.save(path)
    model.write().overwrite().save(path)
    again = TorchModel.load(path)
    assert again.getFeaturesCol() == "raw" and again.uid == model.uid
    torch.testing.assert_close(again.network.output(x), want)
