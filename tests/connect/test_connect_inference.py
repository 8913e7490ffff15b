"""Inference on a Spark Connect session: predictions, keyed outputs and per-example scores from DataFrames (and
batch files), equal to the local network's, every row keeping its key."""

from __future__ import annotations

import pytest
import torch

from torchspark import DataSet, Network, datasets, models, optim
from torchspark.errors import DataError
from torchspark.spark import SparkNetwork, export_batches
from torchspark.spark.inference import regularization_score

N, F, C = 90, 5, 3


@pytest.fixture(scope="module")
def data() -> DataSet:
    return datasets.synthetic_classification(N, F, C, seed=2, noise=2.0)


@pytest.fixture(scope="module")
def net(data: DataSet) -> Network:
    network = Network(models.mlp(F, 12, C), updater=optim.Adam(lr=1e-2), seed=0, weight_decay=1e-3)
    return network.fit(data, epochs=2, batch_size=30)


@pytest.fixture(scope="module")
def df(connect_spark, data):
    rows = [(f"row{i}", data.features[i].tolist(), int(data.labels[i]), i) for i in range(N)]
    return connect_spark.createDataFrame(rows, "key string, features array<float>, label long, id long").repartition(3)


def _close(values: list[float], want: torch.Tensor) -> None:
    """Losses of the same examples in other batches: equal up to float32 rounding."""
    torch.testing.assert_close(torch.tensor(values, dtype=torch.float64), want.double(), rtol=1e-5, atol=1e-6)


def test_predictions_equal_the_local_network_output(connect_spark, net, data, df) -> None:
    snet = SparkNetwork(connect_spark, net)
    want = net.output(data.features)
    probs = {r["id"]: r["prediction"] for r in snet.predict(df, batch_size=7).select("id", "prediction").collect()}
    assert sorted(probs) == list(range(N))
    torch.testing.assert_close(torch.tensor([probs[i] for i in range(N)]), want)
    classes = {r["id"]: r["prediction"] for r in snet.predict(df, output="class").collect()}
    assert [classes[i] for i in range(N)] == want.argmax(1).tolist()


def test_keyed_inference_keeps_every_key_once(connect_spark, net, data, df) -> None:
    out = SparkNetwork(connect_spark, net).feed_forward_with_key(df, batch_size=16, key_col="key")
    assert out.columns == ["key", "output"]
    rows = out.collect()
    assert sorted(r["key"] for r in rows) == sorted(f"row{i}" for i in range(N))
    want = net.output(data.features)
    for r in rows:
        torch.testing.assert_close(torch.tensor(r["output"]), want[int(r["key"][3:])])


def test_score_examples_equal_local_losses_by_row(connect_spark, net, data, df) -> None:
    snet = SparkNetwork(connect_spark, net)
    local = net.score_examples(data)
    scored = snet.score_examples(df, batch_size=8)
    assert scored.columns == df.columns + ["score"]  # every column kept
    got = {r["id"]: r["score"] for r in scored.collect()}
    _close([got[i] for i in range(N)], local.double())
    reg = regularization_score(net)
    assert reg > 0
    with_reg = {r["id"]: r["score"] for r in snet.score_examples(df, include_regularization=True).collect()}
    _close([with_reg[i] for i in range(N)], local.double() + reg)
    keyed = snet.score_examples_with_key(df, key_col="id", score_col="loss")
    assert keyed.columns == ["id", "loss"]
    by_key = {r["id"]: r["loss"] for r in keyed.collect()}
    _close([by_key[i] for i in range(N)], local.double())


def test_score_examples_of_batch_files_name_the_file_and_the_example(connect_spark, net, df, tmp_path) -> None:
    from torchspark.data import load_batch

    paths = export_batches(df, str(tmp_path / "b"), batch_size=20)
    rows = SparkNetwork(connect_spark, net).score_examples(paths).collect()
    assert len(rows) == N
    for path in paths:
        mine = sorted((r["example"], r["score"]) for r in rows if r["path"] == path)
        local = net.score_examples(load_batch(path)).double()
        assert [e for e, _ in mine] == list(range(len(local)))
        _close([s for _, s in mine], local)


def test_bad_rows_and_missing_columns_say_what_is_wrong(connect_spark, net, df) -> None:
    snet = SparkNetwork(connect_spark, net)
    with pytest.raises(DataError, match="no key column 'nope'"):
        snet.feed_forward_with_key(df, key_col="nope")
    with pytest.raises(DataError, match="no key column 'nope'"):
        snet.score_examples_with_key(df, key_col="nope")
    with pytest.raises(DataError, match=r"no column\(s\) \['pixels'\]"):
        snet.score_examples(df, features_col="pixels")
    ragged = connect_spark.createDataFrame([([0.0] * F, 1), ([0.0] * (F - 1), 0)], "features array<double>, label long")
    with pytest.raises(Exception, match="arrays of different lengths"):  # lazy: raised by the user's action
        snet.score_examples(ragged.coalesce(1)).collect()


def test_predict_refuses_or_nulls_rows_with_nan_features(connect_spark, net, data) -> None:
    """A NaN row used to get class 0 silently on Connect too: now DataError (default) or a null prediction."""
    rows = [(i, data.features[i].tolist()) for i in range(12)]
    rows[7] = (7, [float("nan")] * F)
    df = connect_spark.createDataFrame(rows, "id long, features array<double>").coalesce(1)
    snet = SparkNetwork(connect_spark, net)
    for output in ("class", "probabilities"):
        with pytest.raises(Exception, match=r"features column 'features'.*have NaN or inf features.*non_finite='null'"):
            snet.predict(df, output=output).collect()
    want = net.output(data.features[:12])
    kept = [i for i in range(12) if i != 7]
    classes = {r["id"]: r["prediction"] for r in snet.predict(df, output="class", non_finite="null").collect()}
    assert classes[7] is None and [classes[i] for i in kept] == want[kept].argmax(1).tolist()
    probs = {r["id"]: r["prediction"] for r in snet.predict(df, non_finite="null").collect()}
    assert probs[7] is None
    torch.testing.assert_close(torch.tensor([probs[i] for i in kept]), want[kept])
    keyed = {r["id"]: r["output"] for r in snet.feed_forward_with_key(df, key_col="id", non_finite="null").collect()}
    assert keyed[7] is None and len(keyed) == 12
