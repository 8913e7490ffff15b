"""MlflowListener end to end against a real MLflow tracking server (sqlite backend) started here on loopback.

A Spark fit inside the caller's active run logs a nested run whose ``model/`` is an MLflow PyTorch model:
``mlflow.pyfunc.load_model`` predicts what ``network.output`` does, ``mlflow.pyfunc.spark_udf`` scores a Spark
DataFrame with it, and the model registry (the server's sqlite store) registers it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("mlflow", reason="the [mlflow] extra is part of the test extra")
pytest.importorskip("sqlalchemy", reason="the [mlflow] extra brings SQLAlchemy (the sqlite store)")
pytest.importorskip("flask", reason="the [test] extra brings what `mlflow server` needs")

import mlflow  # noqa: E402
import pandas as pd  # noqa: E402

from torchspark import Network, datasets, models, optim  # noqa: E402
from torchspark.listeners.mlflow_listener import MlflowListener  # noqa: E402
from torchspark.spark import ParameterAveragingTrainingMaster, SparkNetwork  # noqa: E402

#: how long the server may take to answer /health (it creates the sqlite schema first: ~15 s on a busy 2-core box)
READY_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen, url: str, log_path: str, timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; fail at ``timeout_s`` or as soon as the server process exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2.0) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(log_path, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-3000:]
            state = f"exited with {proc.returncode}" if proc.poll() is not None else f"not ready in {timeout_s:g} s"
            pytest.fail(f"mlflow server {state}:\n{tail}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    """``mlflow server`` on 127.0.0.1 with a sqlite backend and proxied artifacts; yields its URL."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = str(root / "server.log")
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    # the server's background job runner (huey) is not needed to track runs
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    try:
        _wait_ready(proc, url + "/health", log_path, READY_TIMEOUT_S)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def test_a_fit_in_an_active_run_logs_a_nested_run_with_a_pyfunc_model(spark, sc, mlflow_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # the caller's store: the listener's default too
    data = datasets.synthetic_classification(256, 4, 3, seed=5)
    net = Network(models.mlp(4, 16, 3), updater=optim.Adam(lr=1e-2), seed=0)
    listener = MlflowListener(experiment="ignored-when-nested", log_model=True)
    assert listener.tracking_uri == mlflow_server
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2, num_workers=2)
    spark_net = SparkNetwork(spark, net, master, progress=False)
    spark_net.add_training_listener(listener)
    mlflow.set_experiment("caller")
    with mlflow.start_run() as parent:
        spark_net.fit(sc.parallelize(data.split(64), 2), epochs=1)
        assert mlflow.active_run().info.run_id == parent.info.run_id  # the caller's run is left alone
    client = mlflow.MlflowClient()
    run = client.get_run(listener.run_id)
    assert run.info.status == "FINISHED" and run.info.run_id != parent.info.run_id
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert run.info.experiment_id == parent.info.experiment_id  # nested runs live in the parent's experiment
    assert run.data.params["master.averaging_frequency"] == "2"
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"

    # the MLflow model: pyfunc predicts what network.output does, with the signature of a 4-column input
    model_uri = f"runs:/{listener.run_id}/model"
    model = mlflow.pyfunc.load_model(model_uri)
    assert model.metadata.get_input_schema().input_names() == ["f0", "f1", "f2", "f3"]
    x = data.features[:10].numpy()
    frame = pd.DataFrame(x, columns=["f0", "f1", "f2", "f3"])
    predicted = np.asarray(model.predict(frame))
    np.testing.assert_allclose(predicted, net.output(data.features[:10]).numpy(), rtol=1e-5, atol=1e-6)
    # torchspark's own save beside it resumes training
    local = client.download_artifacts(listener.run_id, "torchspark-network")
    assert np.array_equal(Network.load(local).params().numpy(), net.params().numpy())

    # spark_udf scores a Spark DataFrame with it
    score = mlflow.pyfunc.spark_udf(spark, model_uri, result_type="array<float>", env_manager="local")
    sdf = spark.createDataFrame(frame.astype("float64"))  # Spark doubles: the signature takes them
    rows = sdf.withColumn("p", score("f0", "f1", "f2", "f3")).select("p").collect()
    np.testing.assert_allclose(np.array([r.p for r in rows]), predicted, rtol=1e-5, atol=1e-6)

    # and the server's registry takes it
    version = mlflow.register_model(model_uri, "torchspark-mlp")
    assert version.version == "1" or version.version == 1
