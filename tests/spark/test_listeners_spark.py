"""MLflow and TensorBoard listeners on real Spark fits: a local MLflow file store and event files read back."""

from __future__ import annotations

import os

import pytest
import torch

from torchspark import Network, datasets, models, optim
from torchspark.encoding import AdaptiveThreshold
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork

pytest.importorskip("mlflow", reason="the [mlflow] extra is part of the test extra")
pytest.importorskip("tensorboardX", reason="the [tensorboard] extra is part of the test extra")

from mlflow.tracking import MlflowClient  # noqa: E402

from torchspark.listeners.mlflow_listener import MlflowListener  # noqa: E402
from torchspark.listeners.tensorboard_listener import TensorBoardListener, read_scalars  # noqa: E402


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_and_tensorboard_follow_a_sharing_fit_then_an_averaging_fit(spark, sc, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses file stores without it
    uri = (tmp_path / "mlruns").as_uri()
    mlf = MlflowListener(tracking_uri=uri, experiment="listeners-test", log_every=1)
    tb = TensorBoardListener(tmp_path / "tb")
    data = datasets.synthetic_classification(512, 16, 4, seed=3)
    rdd = sc.parallelize(data.split(64), 2)
    net = Network(models.mlp(16, 32, 4), updater=optim.Adam(lr=1e-2), seed=0)
    sharing = SharedTrainingMaster(
        batch_size_per_worker=16,
        num_workers=2,
        collect_training_stats=True,
        threshold_algorithm=AdaptiveThreshold(initial=1e-2),
    )
    spark_net = SparkNetwork(spark, net, sharing, progress=False)
    spark_net.add_training_listener(mlf)
    spark_net.add_training_listener(tb)
    spark_net.fit(rdd, epochs=2)

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(mlf.run_id)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["master.type"] == sharing.kind and params["master.batch_size_per_worker"] == "16"
    assert float(params["master.threshold_algorithm.initial"]) == 1e-2
    assert params["network.num_params"] == str(net.num_params()) and params["num_workers"] == "2"
    # one metric per epoch: every worker's examples, the agreed score, sharing traffic
    assert _history(client, mlf.run_id, "epoch_examples") == [(0, 512.0), (1, 512.0)]
    scores = _history(client, mlf.run_id, "epoch_score")
    assert [s for s, _ in scores] == [0, 1] and all(0 < v < 10 for _, v in scores)
    sent = _history(client, mlf.run_id, "epoch_bytes_sent")
    dense = _history(client, mlf.run_id, "epoch_dense_bytes")
    assert all(v > 0 for _, v in sent) and sum(v for _, v in sent) < sum(v for _, v in dense)
    assert sum(v for _, v in sent) <= net.extra_config["sharing.bytes_sent"]
    assert client.get_metric_history(mlf.run_id, "score"), "log_every=1 logs every progress report"
    # artifacts: the MLflow model, torchspark's save (it loads and equals the driver's network), the stats report
    names = {a.path for a in client.list_artifacts(mlf.run_id)}
    assert {"model", "torchspark-network", "stats.html", "stats.json"} <= names
    assert "MLmodel" in {os.path.basename(a.path) for a in client.list_artifacts(mlf.run_id, "model")}
    local = client.download_artifacts(mlf.run_id, "torchspark-network", str(tmp_path / "dl"))
    assert torch.equal(Network.load(local).params(), net.params())
    html = client.download_artifacts(mlf.run_id, "stats.html", str(tmp_path / "dl"))
    assert "worker-1" in open(html, encoding="utf-8").read()

    # TensorBoard, read back from the event file: the same epoch scores, traffic that only grows
    tb.writer.flush()
    scalars = read_scalars(tmp_path / "tb")
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in scores] == scalars["epoch/score"]
    traffic = [v for _, v in scalars["sharing/bytes_sent"]]
    assert traffic and traffic == sorted(traffic)
    assert all(v > 1 for _, v in scalars["sharing/compression"])  # dense bytes / bytes sent
    assert [s for s, _ in scalars["train/score"]] == sorted(s for s, _ in scalars["train/score"])

    # a second fit (parameter averaging) is a second run; steps continue from the network's counters
    averaging = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2, num_workers=2)
    spark_net2 = SparkNetwork(spark, net, averaging, progress=False)
    spark_net2.add_training_listener(mlf)
    spark_net2.add_training_listener(tb)
    spark_net2.fit(rdd, epochs=1)
    assert len(mlf.run_ids) == 2
    run2 = client.get_run(mlf.run_ids[1])
    assert run2.info.status == "FINISHED" and run2.data.params["master.averaging_frequency"] == "2"
    assert _history(client, run2.info.run_id, "epoch_examples") == [(2, 512.0)]
    assert client.get_metric_history(run2.info.run_id, "epoch_bytes_sent") == []  # no sharing traffic
    tb.close()
    scalars = read_scalars(tmp_path / "tb")
    assert [s for s, _ in scalars["epoch/score"]] == [0, 1, 2]
    assert _history(client, run2.info.run_id, "epoch_score")[0][1] == pytest.approx(scalars["epoch/score"][2][1])
    assert os.listdir(tmp_path / "tb")


def test_the_rounds_route_feeds_listeners_from_the_driver(spark, sc) -> None:
    """``averaging_via="spark"``: no progress connection from executors; the driver reports every round."""
    from torchspark.listeners import EpochEvent, FitEnded, IterationEvent, TrainingListener

    class Recorder(TrainingListener):
        def __init__(self) -> None:
            self.iterations: list[IterationEvent] = []
            self.epochs: list[EpochEvent] = []
            self.ended: list[FitEnded] = []

        def on_iteration(self, event: IterationEvent) -> None:
            self.iterations.append(event)

        def on_epoch_end(self, event: EpochEvent) -> None:
            self.epochs.append(event)

        def on_fit_end(self, event: FitEnded) -> None:
            self.ended.append(event)

    data = datasets.synthetic_classification(256, 8, 3, seed=4)
    net = Network(models.mlp(8, 8, 3), seed=0)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, averaging_frequency=4, num_workers=2, averaging_via="spark"
    )
    spark_net = SparkNetwork(spark, net, master, progress=False)
    rec = Recorder()
    spark_net.add_training_listener(rec)
    spark_net.fit(sc.parallelize(data.split(32), 2), epochs=2)
    assert [(e.epoch, e.examples) for e in rec.epochs] == [(0, 256), (1, 256)]
    assert rec.iterations and rec.iterations[-1].examples == 512
    assert rec.iterations[-1].iteration == net.iteration  # the furthest worker's minibatches: the network's counter
    assert len(rec.ended) == 1 and rec.ended[0].error is None and rec.ended[0].network is net
