"""The CLI's Spark commands, run in-process on the suite's local[2] session (which they must leave running)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from helpers import assert_replicas_identical
from torchspark import Network
from torchspark.cli import main
from torchspark.stats import TrainingStats


def test_train_evaluate_predict_round_trip(spark, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["train", "--epochs", "8", "--no-progress", "--output", str(out)]) == 0  # sharing, the default
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["training_mode"] == "sharing" and metrics["runner"] == "SparkNetwork"
    assert metrics["accuracy"] >= 0.95, metrics
    assert metrics["replicas_identical"] is True and metrics["bytes_sent"] < 0.05 * metrics["dense_bytes"]
    html = (out / "stats.html").read_text()
    assert "worker-0" in html and "worker-1" in html and "exchange" in html
    stats = TrainingStats.from_json((out / "stats.json").read_text())
    assert_replicas_identical(stats, metrics["num_workers"], net=Network.load(str(out / "model")))

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
    assert main(["train", "--training-mode", "averaging", "--epochs", "1", "--no-progress", "--output", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["training_mode"] == "averaging"
    assert main(["evaluate", "--model", str(out / "model"), "--data", "digits:validation"]) == 2
    assert "digits:train and digits:test" in capsys.readouterr().err
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_train_options_reach_spark_and_the_master(tmp_path) -> None:
    """``torchspark train --master ...`` in a fresh process (no active session, so --master is used): the session
    runs on that master, and the workers train with --batch-size-per-worker and --averaging-frequency."""
    from torchspark.stats import TrainingStats

    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    cmd = [
        sys.executable,
        "-m",
        "torchspark.cli",
        "train",
        "--master",
        "local[3]",
        "--num-workers",
        "2",
        "--training-mode",
        "averaging",
        "--model",
        "mlp",
        "--epochs",
        "1",
        "--batch-size-per-worker",
        "32",
        "--averaging-frequency",
        "3",
        "--no-progress",
        "--output",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # a quiet start: none of the JVM's start-up warnings (they were the first ten lines) without --verbose
    for chatter in ("incubator modules", "log4j", "NativeCodeLoader", "resolves to a loopback address"):
        assert chatter not in proc.stderr, proc.stderr[:2000]
    metrics = json.loads((out / "metrics.json").read_text())
    # training throughput over the fit alone; the session's start is reported apart
    assert metrics["startup_seconds"] > 0 and metrics["fit_seconds"] > 0
    assert metrics["examples_per_second"] == pytest.approx(1437 / metrics["fit_seconds"])
    assert metrics["train_seconds"] >= metrics["startup_seconds"] + metrics["fit_seconds"]
    assert metrics["spark_master"] == "local[3]", metrics  # the default would be local[2] (--num-workers)
    master = metrics["master"]
    assert (master["batch_size_per_worker"], master["averaging_frequency"], master["num_workers"]) == (32, 3, 2)
    # what the workers did: 1437 digits in minibatches of at most 32 (the 2 input partitions are re-batched
    # separately, so up to 2 short ones), averaged every 3 minibatches: ceil(iterations / 3) rounds, as DL4J
    summary = TrainingStats.from_json((out / "stats.json").read_text()).summary()
    assert summary["examples"] == 1437
    assert 45 <= summary["minibatches"] <= 46, summary  # ceil(1437 / 32) = 45; the default 16 gives >= 90
    assert summary["counts"]["averaging"] == 2 * math.ceil(summary["iterations"] / 3), summary


def test_verbose_shows_what_the_jvm_prints(tmp_path) -> None:
    """``--verbose`` keeps the JVM's own stderr (its start-up notices, Spark's log) on the terminal."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    cmd = [
        sys.executable,
        "-m",
        "torchspark.cli",
        "train",
        "--verbose",
        "--num-workers",
        "1",
        "--training-mode",
        "averaging",
        "--model",
        "mlp",
        "--epochs",
        "1",
        "--no-progress",
        "--output",
        str(tmp_path / "run"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "log4j" in proc.stderr or "WARN" in proc.stderr, proc.stderr[:2000]


def _untrained_model(path) -> str:
    from torchspark import models, optim

    Network(models.lenet(1, 10, 8, 8), updater=optim.Adam(lr=1e-3), seed=0).save(str(path))
    return str(path)


def _one_line_error(err: str, fragment: str) -> None:
    assert err.startswith("torchspark: error: ") and err.count("\n") == 1, err[-3000:]
    assert fragment in err and "Traceback" not in err and "py4j" not in err.lower(), err[-3000:]


def test_predict_never_deletes_what_it_did_not_write(spark, tmp_path, capsys) -> None:
    """The issue's three deletions (a directory of the user's files, the parent of --data, the --model directory):
    each refused with exit 2 and one line, nothing touched; --overwrite replaces a directory of the user's files
    (and only with it), through a temporary sibling that does not stay behind."""
    model = _untrained_model(tmp_path / "model")
    data_dir = tmp_path / "data"
    data = str(data_dir / "in.parquet")
    assert main(["predict", "--model", model, "--output", data]) == 0  # a new path, under a new directory
    (data_dir / "README").write_text("the data")
    shape = ["--feature-shape", "1,8,8"]
    for output, fragment in ((data_dir, "holds --data"), (tmp_path / "model", "is --model")):
        argv = ["predict", "--model", model, "--data", data, *shape, "--output", str(output), "--overwrite"]
        capsys.readouterr()
        assert main(argv) == 2
        _one_line_error(capsys.readouterr().err, fragment)
    assert sorted(p.name for p in data_dir.iterdir()) == ["README", "in.parquet"]
    assert spark.read.parquet(data).count() == 360 and (data_dir / "README").read_text() == "the data"
    assert Network.load(model).num_params() > 0  # the model is still the model

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    argv = ["predict", "--model", model, "--data", data, *shape, "--output", str(mine), "--class"]
    capsys.readouterr()
    assert main(argv) == 2
    _one_line_error(capsys.readouterr().err, "already exists and holds 1 entry (e.g. 'notes.txt'); pass --overwrite")
    assert (mine / "notes.txt").read_text() == "mine"
    assert main([*argv, "--overwrite"]) == 0
    assert not (mine / "notes.txt").exists()
    rows = spark.read.parquet(str(mine)).collect()
    assert len(rows) == 360 and all(0 <= r["prediction"] < 10 for r in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "mine", "model"]  # no temporary sibling left
    assert not spark.sparkContext._jsc.sc().isStopped()


def test_predict_input_errors_are_one_line_and_leave_nothing(spark, tmp_path, capsys) -> None:
    """--data that is not Parquet, and rows the network cannot take (null features, found while Spark writes):
    one line, exit 2, no output and no temporary sibling (was a Py4J trace of 162 lines)."""
    model = _untrained_model(tmp_path / "model")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("not parquet\n")
    out = tmp_path / "out"
    assert main(["predict", "--model", model, "--data", str(notes), "--output", str(out)]) == 2
    _one_line_error(capsys.readouterr().err, f"--data {str(notes)!r} cannot be read as Parquet")
    nulls = str(tmp_path / "nulls.parquet")
    spark.createDataFrame([([0.5] * 64, 0), (None, 1)], "features array<double>, label long").write.parquet(nulls)
    argv = ["predict", "--model", model, "--data", nulls, "--feature-shape", "1,8,8", "--output", str(out)]
    assert main(argv) == 2
    _one_line_error(capsys.readouterr().err, "predict: the features column has 1 null rows")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "notes", "nulls.parquet"]


def _digits_rows(split: str) -> list[tuple[list[float], int]]:
    from torchspark import datasets

    data = datasets.digits(split)
    return [(data.features[i].flatten().tolist(), int(data.labels[i])) for i in range(len(data))]  # type: ignore[index]


def test_train_on_your_own_parquet_and_table(spark, tmp_path, capsys) -> None:
    """``train --data``: a Parquet path (images via --feature-shape, a held-out fraction) and a catalog table with a
    separate --test-data table (the rows as vectors, --model mlp); the metrics name what was read and learned."""
    train_rows, test_rows = _digits_rows("train"), _digits_rows("test")
    parquet = str(tmp_path / "train.parquet")
    spark.createDataFrame(train_rows, "pixels array<double>, digit long").write.parquet(parquet)
    out = tmp_path / "parquet-run"
    argv = ["train", "--data", parquet, "--features-col", "pixels", "--label-col", "digit", "--feature-shape", "1,8,8"]
    argv += ["--training-mode", "averaging", "--epochs", "3", "--test-fraction", "0.25", "--seed", "3"]
    assert main([*argv, "--no-progress", "--output", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"] == parquet and metrics["num_classes"] == 10 and metrics["sample_shape"] == [1, 8, 8]
    assert metrics["train_examples"] + metrics["test_examples"] == len(train_rows)
    assert 0.15 * len(train_rows) < metrics["test_examples"] < 0.35 * len(train_rows)  # --test-fraction 0.25
    assert metrics["accuracy"] > 0.8, metrics["accuracy"]  # lenet learns the digits (chance: 0.1)
    assert Network.load(str(out / "model")).num_params() > 0
    assert f"on {metrics['test_examples']} test rows" in capsys.readouterr().out

    spark.createDataFrame(train_rows, ["features", "label"]).createOrReplaceTempView("ts_cli_digits_train")
    spark.createDataFrame(test_rows, ["features", "label"]).createOrReplaceTempView("ts_cli_digits_test")
    out = tmp_path / "table-run"
    argv = ["train", "--data", "table:ts_cli_digits_train", "--test-data", "table:ts_cli_digits_test", "--model", "mlp"]
    assert main([*argv, "--epochs", "1", "--no-progress", "--output", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["sample_shape"] == [64]  # the row as a vector
    assert (metrics["train_examples"], metrics["test_examples"]) == (len(train_rows), len(test_rows))


def test_train_on_your_own_data_refuses_what_cannot_work(spark, tmp_path, capsys) -> None:
    """Each bad --data setting: exit 2, one line naming the option and the fix, nothing written."""
    parquet = str(tmp_path / "flat.parquet")
    spark.createDataFrame(_digits_rows("test")[:40], ["features", "label"]).write.parquet(parquet)
    strings = str(tmp_path / "strings.parquet")
    spark.createDataFrame([([0.5] * 64, -1), ([0.5] * 64, 2)], ["features", "label"]).write.parquet(strings)
    out = str(tmp_path / "out")
    cases = [
        (["--data", parquet, "--label-col", "digit"], "--label-col 'digit' is not a column of --data"),
        (["--data", parquet], "--model lenet takes images, but each example has shape (64,)"),
        (["--data", "table:no_such_table_here"], "the session's catalog has no such table"),
        (["--data", str(tmp_path / "missing")], "does not exist"),
        (["--data", strings, "--model", "mlp"], "train's classifiers take class indices 0..K-1"),
        (["--data", parquet, "--model", "mlp", "--num-classes", "3"], "--num-classes 3 is fewer than the labels need"),
    ]
    for extra, message in cases:
        assert main(["train", *extra, "--epochs", "1", "--no-progress", "--output", out]) == 2, extra
        _one_line_error(capsys.readouterr().err, message)
    assert not os.path.exists(out)
