"""CSV -> DataFrame -> Spark ML Pipeline (VectorAssembler, StandardScaler, TorchEstimator) -> save -> load.

The CSV needs a header; every column but the label is a numeric feature. A string label is indexed with
``StringIndexer`` first. ::

    python examples/csv_pipeline.py --csv iris.csv --label species --epochs 20 --output iris-model

The saved directory is an ordinary ``PipelineModel``: ``PipelineModel.load(path).transform(df)`` adds
``prediction`` and ``probability`` columns, the network stored as JSON + safetensors inside it (no pickle).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("examples.csv_pipeline")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", required=True, help="path or URL of a CSV file with a header row")
    p.add_argument("--label", default="label", help="label column (class indices, or strings to index)")
    p.add_argument("--hidden", type=int, default=32, help="hidden units of the MLP")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16, help="minibatch size on each worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--output", default=None, help="where to save the fitted PipelineModel (default: a temp dir)")
    p.add_argument("--master", default=None, help="Spark master (default: the active session, else local[workers])")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import StandardScaler, StringIndexer, VectorAssembler

    from torchspark.nn.network_spec import NetworkSpec
    from torchspark.spark import ParameterAveragingTrainingMaster, session_scope
    from torchspark.spark.ml import TorchEstimator

    args = parse_args(argv)
    with session_scope(cores=args.num_workers, master=args.master, app_name="csv-pipeline") as spark:
        df = spark.read.csv(args.csv, header=True, inferSchema=True)
        features = [c for c in df.columns if c != args.label]
        if args.label not in df.columns or not features:
            raise SystemExit(
                f"--label {args.label!r} must name one of the CSV's columns {df.columns}, "
                f"and at least one other column must hold features"
            )
        stages: list[Any] = []
        label = args.label
        if dict(df.dtypes)[label] == "string":  # class names -> indices 0..C-1
            stages.append(StringIndexer(inputCol=label, outputCol="label_index"))
            label = "label_index"
        n_classes = df.select(args.label).distinct().count()
        spec = NetworkSpec(
            "mlp",
            {"n_in": len(features), "hidden": args.hidden, "n_out": n_classes},
            updater={"type": "adam", "lr": args.lr},
            seed=0,
        )
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=args.batch_size,
            num_workers=args.num_workers,
            averaging_frequency=2,
            rdd_training_approach="direct",
            rng_seed=0,
        )
        stages += [
            VectorAssembler(inputCols=features, outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="scaled", withMean=True, withStd=True),
            TorchEstimator(
                network=spec.to_json(),
                trainingMaster=master.to_json(),
                epochs=args.epochs,
                learningRate=args.lr,
                featuresCol="scaled",
                labelCol=label,
            ),
        ]
        model = Pipeline(stages=stages).fit(df)
        scored = model.transform(df)
        accuracy = MulticlassClassificationEvaluator(labelCol=label, metricName="accuracy").evaluate(scored)
        with tempfile.TemporaryDirectory() as tmp:
            path = args.output or f"{tmp}/model"
            model.write().overwrite().save(path)
            reloaded = PipelineModel.load(path).transform(df)
            same = scored.select("prediction").collect() == reloaded.select("prediction").collect()
        log.info("accuracy %.3f on %d rows; saved model gives the same predictions: %s", accuracy, df.count(), same)
        return {
            "rows": df.count(),
            "features": features,
            "classes": n_classes,
            "accuracy": accuracy,
            "reloaded_same_predictions": same,
            "saved_to": args.output,
        }


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(json.dumps(main()))
