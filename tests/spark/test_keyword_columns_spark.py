"""DataFrame columns as keyword inputs on Spark: ``features_col={"input_ids": "ids", "attention_mask": "mask"}``
feeds a Hugging Face style model (``module(input_ids=..., attention_mask=...)``, its own loss) through fit, evaluate
and predict, token ids staying int64 (the model raises on floats), each column with its own shape."""

from __future__ import annotations

import cloudpickle
import numpy as np
import pytest
import torch
from pyspark import cloudpickle as spark_cloudpickle

import keyword_model
from keyword_model import KeywordDataset, TinySequenceClassifier, keyword_task
from torchspark import optim
from torchspark.data import Columns
from torchspark.errors import ConfigError, DataError
from torchspark.nn import Network
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork

# the executors rebuild the model without tests/ on their path
cloudpickle.register_pickle_by_value(keyword_model)
spark_cloudpickle.register_pickle_by_value(keyword_model)

KEYWORDS = {"input_ids": "ids", "attention_mask": "mask"}


def _frame(spark, n: int, seed: int):
    ids, mask, labels = keyword_task(n, seed)
    rows = [(i.tolist(), m.tolist(), int(y)) for i, m, y in zip(ids, mask, labels)]
    return spark.createDataFrame(rows, "ids array<bigint>, mask array<bigint>, label bigint").repartition(2)


def test_keyword_columns_train_evaluate_and_predict_as_the_local_network_does(spark) -> None:
    train, test = _frame(spark, 384, 0), _frame(spark, 128, 1)
    net = Network(TinySequenceClassifier(), loss=None, updater=optim.Adam(lr=0.05), seed=0)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, num_workers=2, rng_seed=0)
    with SparkNetwork(spark, net, master, progress=False) as snet:
        snet.fit(train, epochs=3, features_col=KEYWORDS, label_col="label")
        evaluation = snet.evaluate(test, columns=Columns(KEYWORDS, "label"))
        # per-keyword shapes: input_ids rows reshaped (here to their own length), attention_mask kept flat
        predicted = snet.predict(test, features_col=KEYWORDS, feature_shape={"input_ids": (10,)}, output="class")
        rows = predicted.select("ids", "mask", "label", "prediction").collect()
    local = KeywordDataset(128, seed=1)
    assert evaluation.accuracy() == pytest.approx(net.evaluate(local).accuracy(), abs=1e-9)
    assert evaluation.accuracy() > 0.9, "3 averaged epochs learn the keyword"
    ids = torch.tensor([r["ids"] for r in rows])
    mask = torch.tensor([r["mask"] for r in rows])
    assert ids.dtype == torch.int64
    want = net.output({"input_ids": ids, "attention_mask": mask}).argmax(1)
    assert [r["prediction"] for r in rows] == want.tolist()


def test_a_keyword_column_that_is_missing_or_not_numeric_is_refused_before_any_job(spark) -> None:
    from pyspark.sql import functions as F

    frame = _frame(spark, 8, 2).withColumn("text", F.lit("a b"))
    net = Network(TinySequenceClassifier(), loss=None, seed=0)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=4, num_workers=2)
    sc = spark.sparkContext
    sc.setJobGroup("keyword-columns-refused", "no job may run")
    try:
        with SparkNetwork(spark, net, master, progress=False) as snet:
            missing = {"input_ids": "ids", "attention_mask": "attn"}
            message = r"features_col maps attention_mask='attn' but the DataFrame has no column\(s\) \['attn'\]; it has"
            with pytest.raises(ConfigError, match=message + r" \['ids', 'mask', 'label', 'text'\]"):
                snet.fit(frame, features_col=missing)
            with pytest.raises(ConfigError, match=message):
                snet.predict(frame, features_col=missing)
            with pytest.raises(DataError, match=r"column 'text' has type string"):
                snet.fit(frame, features_col={"input_ids": "text", "attention_mask": "mask"})
            with pytest.raises(DataError, match=r"column 'text' has type string"):
                snet.predict(frame, features_col={"input_ids": "text", "attention_mask": "mask"})
        assert list(sc.statusTracker().getJobIdsForGroup("keyword-columns-refused")) == []
    finally:
        sc.setJobGroup("", "")
    assert np.isfinite(net.params().numpy()).all()
