"""The CLI's Spark commands, run in-process on the suite's local[2] session (which they must leave running)."""

from __future__ import annotations

import json

import pytest

from torchspark.cli import main

pytestmark = pytest.mark.spark


def test_train_evaluate_predict_round_trip(spark, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["train", "--epochs", "8", "--no-progress", "--output", str(out)]) == 0  # sharing, the default
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mode"] == "sharing" and metrics["runner"] == "SparkNetwork"
    assert metrics["accuracy"] >= 0.95, metrics
    assert metrics["replicas_identical"] is True and metrics["bytes_sent"] < 0.05 * metrics["dense_bytes"]
    html = (out / "stats.html").read_text()
    assert "worker-0" in html and "worker-1" in html and "exchange" in html
    assert json.loads((out / "stats.json").read_text())

    assert main(["evaluate", "--model", str(out / "model"), "--output", str(tmp_path / "ev.json")]) == 0
    evaluation = json.loads((tmp_path / "ev.json").read_text())
    assert "Accuracy" in capsys.readouterr().out
    from torchspark.evaluation import evaluation_from_json

    assert evaluation_from_json(json.dumps(evaluation)).accuracy() == metrics["accuracy"]

    pred = tmp_path / "pred.parquet"
    assert main(["predict", "--model", str(out / "model"), "--output", str(pred), "--class"]) == 0
    rows = spark.read.parquet(str(pred)).collect()
    assert len(rows) == 360
    correct = sum(int(r["prediction"] == r["label"]) for r in rows) / len(rows)
    assert correct == metrics["accuracy"]
    assert not spark.sparkContext._jsc.sc().isStopped()  # the CLI left the caller's session running


def test_averaging_mode_and_bad_data(spark, tmp_path, capsys) -> None:
    out = tmp_path / "avg"
    assert main(["train", "--mode", "averaging", "--epochs", "1", "--no-progress", "--output", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["mode"] == "averaging"
    assert main(["evaluate", "--model", str(out / "model"), "--data", "digits:validation"]) == 2
    assert "digits:train and digits:test" in capsys.readouterr().err
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err
