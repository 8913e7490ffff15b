"""TorchEstimator / TorchModel as Spark ML stages on a real local[2] session: fit and transform, Pipeline
save/load, CrossValidator over the learning rate, the params that must reach training, and refusals."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql.types import DoubleType

from torchspark import Network, datasets, models, optim
from torchspark.errors import ConfigError, SerializationError
from torchspark.nn.network_spec import NetworkSpec
from torchspark.spark import ParameterAveragingTrainingMaster
from torchspark.spark.ml import TorchEstimator, TorchModel

N, F, C = 192, 4, 3
SPEC = NetworkSpec("mlp", {"n_in": F, "hidden": 16, "n_out": C}, updater={"type": "sgd", "lr": 0.1}, seed=0)
MASTER = ParameterAveragingTrainingMaster(
    batch_size_per_worker=16, num_workers=2, averaging_frequency=2, rdd_training_approach="direct", rng_seed=0
)


@pytest.fixture(scope="module")
def df(spark):
    data = datasets.synthetic_classification(N, F, C, seed=4, noise=1.0)
    rows = [(*map(float, x.tolist()), float(y)) for x, y in zip(data.features, data.labels)]
    # scaled by 10: StandardScaler has something to do
    rows = [(*(10 * v for v in r[:F]), r[F]) for r in rows]
    return spark.createDataFrame(rows, [f"f{i}" for i in range(F)] + ["label"]).repartition(2).cache()


@pytest.fixture(scope="module")
def array_df(spark, df):
    from pyspark.sql import functions as fn

    return df.select(fn.array(*[fn.col(f"f{i}") / 10 for i in range(F)]).alias("features"), "label").cache()


def _estimator(**kwargs) -> TorchEstimator:
    base = dict(network=SPEC.to_json(), trainingMaster=MASTER.to_json(), epochs=4)
    base.update(kwargs)
    return TorchEstimator(**base)


def _accuracy(frame) -> float:
    return MulticlassClassificationEvaluator(metricName="accuracy").evaluate(frame)


def test_fit_transform_learns_and_writes_spark_ml_columns(array_df) -> None:
    model = _estimator().fit(array_df)
    assert isinstance(model, TorchModel) and model.network.epoch == 4
    out = model.transform(array_df)
    assert isinstance(out.schema["prediction"].dataType, DoubleType)
    assert isinstance(out.schema["probability"].dataType, VectorUDT)
    assert _accuracy(out) > 0.9
    rows = out.select("features", "prediction", "probability").limit(20).collect()
    x = torch.tensor([r.features for r in rows], dtype=torch.float32)
    expected = model.network.output(x)
    np.testing.assert_allclose(np.array([r.probability.toArray() for r in rows]), expected.numpy(), atol=1e-6)
    assert [r.prediction for r in rows] == expected.argmax(dim=1).double().tolist()
    # an empty column param leaves that column out
    slim = model.copy({model.probabilityCol: ""}).transform(array_df)
    assert "probability" not in slim.columns and "prediction" in slim.columns


def test_pipeline_with_vector_features_saves_and_loads_with_the_same_predictions(df, tmp_path) -> None:
    stages = [
        VectorAssembler(inputCols=[f"f{i}" for i in range(F)], outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="scaled", withMean=True),
        _estimator(featuresCol="scaled"),
    ]
    fitted = Pipeline(stages=stages).fit(df)
    path = str(tmp_path / "pipeline")
    fitted.save(path)
    files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    assert any(f.endswith(os.path.join("network", "weights.safetensors")) for f in files)
    assert not any(f.endswith(".pkl") for f in files)  # no pickle anywhere
    loaded = PipelineModel.load(path)
    assert isinstance(loaded.stages[-1], TorchModel)
    before = fitted.transform(df).select("prediction", "probability").collect()
    after = loaded.transform(df).select("prediction", "probability").collect()
    assert [r.prediction for r in before] == [r.prediction for r in after]
    np.testing.assert_array_equal(
        np.array([r.probability.toArray() for r in before]), np.array([r.probability.toArray() for r in after])
    )
    assert _accuracy(loaded.transform(df)) > 0.9


def test_cross_validator_picks_the_better_learning_rate(array_df) -> None:
    est = _estimator(epochs=2)
    grid = ParamGridBuilder().addGrid(est.learningRate, [1e-4, 0.3]).build()
    cv = CrossValidator(
        estimator=est,
        estimatorParamMaps=grid,
        numFolds=2,
        seed=1,
        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
    )
    cv_model = cv.fit(array_df)
    low, high = cv_model.avgMetrics
    assert high > low + 0.2  # 1e-4 barely moves the weights in 2 epochs; 0.3 learns
    assert cv_model.bestModel.network.updater.lr == 0.3


def test_saved_network_path_learning_rate_and_batch_size_params(array_df, tmp_path) -> None:
    start = Network(models.mlp(F, 16, C), updater=optim.SGD(lr=0.1), seed=7)
    start.save(str(tmp_path / "start"))
    model = _estimator(network=str(tmp_path / "start"), epochs=1, learningRate=1e-9, batchSize=8).fit(array_df)
    assert model.network.updater.lr == 1e-9
    # 192 examples on 2 workers: 96 each; minibatches of 8 -> 12 steps (the master's 16 would give 6)
    assert model.network.iteration == 12
    # a tiny learning rate: the trained weights are the saved ones, not a fresh initialisation
    torch.testing.assert_close(model.network.params(), start.params(), atol=1e-6, rtol=0)
    fresh = SPEC.build()
    assert not torch.allclose(model.network.params(), fresh.params(), atol=1e-3)


def test_a_module_of_your_own_trains_by_factory_saves_and_loads(array_df, tmp_path) -> None:
    """network= a factory of yours (its import path in the param), or a spec naming your class with kwargs
    (trustCode); the TorchModel saves without pickle and loads back with the class allowed."""
    import json

    import cloudpickle

    import own_models

    # the executors here do not have tests/ on their path: ship the module's classes by value (a real
    # deployment installs its package on the executors instead)
    cloudpickle.register_pickle_by_value(own_models)
    try:
        est = _estimator(network=own_models.mlp_factory)
        assert est.getNetwork() == "own_models:mlp_factory"
        model = est.fit(array_df)
        assert type(model.network.module) is own_models.DefaultMLP and model.network.epoch == 4
        assert _accuracy(model.transform(array_df)) > 0.5
        model.save(str(tmp_path / "model"))
        with pytest.raises(SerializationError, match=r"factories=\[DefaultMLP\]"):
            TorchModel.load(str(tmp_path / "model"))
        back = TorchModel.read().factories([own_models.DefaultMLP]).load(str(tmp_path / "model"))
        assert torch.equal(back.network.params(), model.network.params())
        into = TorchModel.read().module(own_models.DefaultMLP()).load(str(tmp_path / "model"))
        assert torch.equal(into.network.params(), model.network.params())

        # a path as a string (as a saved estimator holds it): imported only with trustCode
        spec = json.dumps({"model": "own_models:CapturedMLP", "kwargs": {"n_in": F, "hidden": 6, "n_out": C}})
        with pytest.raises(ConfigError, match=r"setNetwork\(MyNet\).*setTrustCode\(True\)"):
            _estimator(network=spec, epochs=1).fit(array_df)
        trusted = _estimator(network=spec, epochs=1, trustCode=True).fit(array_df)
        assert trusted.network.module.fc1.out_features == 6
    finally:
        cloudpickle.unregister_pickle_by_value(own_models)


def test_estimator_params_save_and_load(tmp_path) -> None:
    est = _estimator(learningRate=0.05, featureShape=[F])
    est.save(str(tmp_path / "est"))
    back = TorchEstimator.load(str(tmp_path / "est"))
    assert back.getLearningRate() == 0.05 and back.getFeatureShape() == [F]
    assert back.getNetwork() == SPEC.to_json() and back.getTrainingMaster() == MASTER.to_json()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(network=None), "set the network param"),
        (dict(network='{"model": "resnet_from_somewhere"}'), "unknown model"),
        (dict(network='{"model": "mlp", "factory": "os:system"}'), "unknown key"),
        (dict(trainingMaster='{"type": "nope"}'), "unknown training master"),
        (dict(epochs=0), "TorchEstimator: epochs must be an integer >= 1"),
        (dict(batchSize=0), "TorchEstimator: batchSize must be an integer >= 1"),
        (dict(learningRate=-1.0), "learning rate must be"),
    ],
)
def test_bad_params_are_refused_before_training(array_df, kwargs, match) -> None:
    est = _estimator()
    for name, value in kwargs.items():
        if value is None:
            est.clear(est.getParam(name))
        else:
            est.set(est.getParam(name), value)
    with pytest.raises(ConfigError, match=match):
        est.fit(array_df)


@pytest.mark.parametrize("loss, n_out", [("mse", 1), ("mse", 2), ("bce_with_logits", 2)])
def test_model_columns_for_regression_and_multi_label_networks(array_df, loss, n_out) -> None:
    net = Network(models.mlp(F, 8, n_out), loss=loss, seed=3)
    out = TorchModel(net).transform(array_df)
    rows = out.limit(10).collect()
    expected = net.output(torch.tensor([r.features for r in rows], dtype=torch.float32))
    if loss == "mse":
        assert "probability" not in out.columns  # a regression has no probabilities
        if n_out == 1:
            assert isinstance(out.schema["prediction"].dataType, DoubleType)
            np.testing.assert_allclose([r.prediction for r in rows], expected[:, 0].numpy(), atol=1e-6)
        else:
            np.testing.assert_allclose(np.array([r.prediction.toArray() for r in rows]), expected.numpy(), atol=1e-6)
    else:  # multi-label: one 0/1 flag per output at 0.5, sigmoids as probabilities
        flags = np.array([r.prediction.toArray() for r in rows])
        np.testing.assert_array_equal(flags, (expected.numpy() >= 0.5).astype(float))
        np.testing.assert_allclose(np.array([r.probability.toArray() for r in rows]), expected.numpy(), atol=1e-6)


def test_feature_shape_and_inference_batch_size_params_are_used(array_df) -> None:
    from torchspark.errors import DataError

    with pytest.raises(DataError, match="feature_shape"):  # 4 values per row cannot become (5,)
        _estimator(featureShape=[5]).fit(array_df)
    model = TorchModel(SPEC.build())
    with pytest.raises(ConfigError, match="batch_size"):
        model.copy({model.inferenceBatchSize: 0}).transform(array_df)
