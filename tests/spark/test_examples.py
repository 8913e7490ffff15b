"""Smoke tests of examples/: every script runs end to end with tiny sizes and learns something.

The Spark examples run in this process on the suite's shared local[2] session (their ``session_scope`` reuses
the active session); the ParallelWrapper example runs as a real ``python examples/parallel_wrapper.py``."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import cloudpickle
import numpy as np
import pytest

from torchspark import datasets

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    # run as a script, an example's classes live in __main__ and travel to the executors by value; imported
    # here they would be pickled by reference to a module the executors cannot import
    cloudpickle.register_pickle_by_value(module)
    return module


def _write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    """An MNIST-format IDX file: 0x0000, 0x08 (unsigned byte), ndim, big-endian uint32 dims, the bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


@pytest.mark.spark
def test_mnist_idx_example(spark, tmp_path) -> None:
    digits = datasets.digits("train")
    pixels = (digits.features[:400, 0].numpy() * 255).round().astype(np.uint8)  # (400, 8, 8)
    labels = digits.labels[:400].numpy().astype(np.uint8)
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", pixels, compress=True)
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels, compress=True)
    _write_idx(tmp_path / "test-images-idx3-ubyte", pixels[:200], compress=False)
    _write_idx(tmp_path / "test-labels-idx1-ubyte", labels[:200], compress=False)
    result = _load("mnist_idx_spark").main(
        [
            "--train-images",
            str(tmp_path / "train-images-idx3-ubyte.gz"),
            "--train-labels",
            str(tmp_path / "train-labels-idx1-ubyte.gz"),
            "--test-images",
            str(tmp_path / "test-images-idx3-ubyte"),
            "--test-labels",
            str(tmp_path / "test-labels-idx1-ubyte"),
            "--epochs",
            "4",
            "--batch-size",
            "16",
            "--partitions",
            "4",
            "--lr",
            "3e-3",
        ]
    )
    assert result["examples"] == 400 and result["image_shape"] == [8, 8] and result["epochs"] == 4
    assert result["accuracy"] > 0.5, result  # chance is 0.1


@pytest.mark.spark
def test_csv_pipeline_example(spark, tmp_path) -> None:
    pytest.importorskip("torchspark.spark.ml", reason="TorchEstimator (torchspark.spark.ml) is not on this branch")
    data = datasets.synthetic_classification(240, 4, 3, seed=3, noise=1.0)
    names = ["setosa", "versicolor", "virginica"]
    lines = ["a,b,c,d,species"] + [
        ",".join(f"{10 * v + 50:.4f}" for v in x.tolist()) + f",{names[int(y)]}"
        for x, y in zip(data.features, data.labels)
    ]
    (tmp_path / "flowers.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "model"
    result = _load("csv_pipeline").main(
        ["--csv", str(tmp_path / "flowers.csv"), "--label", "species", "--epochs", "6", "--output", str(out)]
    )
    assert result["rows"] == 240 and result["features"] == ["a", "b", "c", "d"] and result["classes"] == 3
    assert result["accuracy"] > 0.7, result  # chance is 1/3
    assert result["reloaded_same_predictions"] is True
    assert (out / "metadata").exists() and list(out.glob("stages/*TorchModel*"))


@pytest.mark.spark
def test_regression_example(spark) -> None:
    result = _load("regression").main(["--examples", "1024", "--epochs", "4", "--hidden", "32"])
    assert result["mse_after"] < 0.6 * result["mse_before"], result
    assert min(result["r2"]) > 0.2, result
    assert 0 < result["bytes_sent"] < result["dense_bytes"], result  # gradient sharing sent sparse updates


@pytest.mark.spark
def test_two_inputs_two_outputs_example(spark) -> None:
    result = _load("two_inputs_two_outputs").main(["--examples", "768", "--epochs", "4"])
    assert result["loss_after"] < 0.5 * result["loss_before"], result
    assert result["accuracy"] > 0.8, result  # chance is 1/3
    assert result["score_mse"] < 0.5 * result["score_variance"], result  # the regression head learned too


@pytest.mark.multiprocess
def test_parallel_wrapper_example_runs_as_a_script() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "parallel_wrapper.py"),
            "--num-workers",
            "2",
            "--epochs",
            "3",
            "--examples",
            "512",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["workers"] == 2 and result["mode"] == "sharing" and result["examples"] == 512
    assert result["accuracy"] > 0.6, result  # chance is 0.1
