"""TrainingEvents: the progress channel's per-worker messages become fit-wide listener events."""

from __future__ import annotations

import math
import os

import pytest
import torch

from torchspark import Network, models, optim
from torchspark.listeners import EpochEvent, FitEnded, FitStarted, IterationEvent, TrainingEvents, TrainingListener
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.progress.wire import Malformed, progress_from_msg


class Recorder(TrainingListener):
    def __init__(self) -> None:
        self.events: list[object] = []
        self.source: TrainingEvents | None = None  # flushed before reading: listeners run on their own threads

    def on_fit_start(self, event: FitStarted) -> None:
        self.events.append(event)

    def on_iteration(self, event: IterationEvent) -> None:
        self.events.append(event)

    def on_epoch_end(self, event: EpochEvent) -> None:
        self.events.append(event)

    def on_fit_end(self, event: FitEnded) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
        if self.source is not None:
            assert self.source.flush()
        return [e for e in self.events if isinstance(e, kind)]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _events(master=None, workers=2, epochs=2, listeners=None, start=(0, 0)):
    net = Network(models.mlp(4, 4, 2), updater=optim.Adam(lr=1e-3), seed=0)
    net.iteration, net.epoch = start
    rec, clock = Recorder(), Clock()
    master = master or SharedTrainingMaster(num_workers=workers)
    ev = TrainingEvents(
        listeners if listeners is not None else [rec],
        runner="test",
        master=master,
        network=net,
        epochs=epochs,
        num_workers=workers,
        clock=clock,
    )
    for listener in ev.listeners:
        if isinstance(listener, Recorder):
            listener.source = ev
    return ev, rec, clock, net


def test_fit_start_carries_master_and_network_settings() -> None:
    ev, rec, _, net = _events(
        master=ParameterAveragingTrainingMaster(averaging_frequency=7, num_workers=2), start=(40, 3)
    )
    ev.start()
    (started,) = rec.of(FitStarted)
    assert started.master["type"] == "averaging" and started.master["averaging_frequency"] == 7
    assert started.network["num_params"] == net.num_params()
    assert started.network["updater"]["type"] == "adam" and started.network["loss"] == ["cross_entropy"]
    assert (started.start_iteration, started.start_epoch, started.epochs, started.num_workers) == (40, 3, 2, 2)


def test_iteration_events_sum_workers_and_continue_the_networks_counters() -> None:
    ev, rec, clock, _ = _events(start=(100, 5))
    ev.start()
    clock.t += 2.0
    ev.on_progress(ProgressUpdate(0, 0, 10, 160, 1.0, bytes_sent=1000, dense_bytes=40000))
    ev.on_progress(ProgressUpdate(1, 0, 10, 150, 3.0, bytes_sent=500, dense_bytes=40000))
    last = rec.of(IterationEvent)[-1]
    assert last.examples == 310 and last.examples_per_second == pytest.approx(155.0)
    assert (last.bytes_sent, last.dense_bytes) == (1500, 80000)
    assert last.score == pytest.approx(2.0)  # mean of the workers' latest losses
    assert (last.iteration, last.epoch, last.rank) == (110, 5, 1)
    # a late, repeated report adds nothing
    ev.on_progress(ProgressUpdate(1, 0, 10, 150, 3.0, bytes_sent=500, dense_bytes=40000))
    assert rec.of(IterationEvent)[-1].examples == 310
    # the next epoch: iterations add up per worker, the furthest worker sets the step
    ev.on_progress(ProgressUpdate(0, 1, 4, 64, 0.5, bytes_sent=1200, dense_bytes=56000))
    last = rec.of(IterationEvent)[-1]
    assert (last.iteration, last.epoch, last.examples) == (114, 6, 374)
    assert last.bytes_sent == 1700


def test_epoch_closes_when_every_worker_moved_on_with_its_traffic_and_time() -> None:
    ev, rec, clock, _ = _events()
    ev.start()
    ev.on_progress(ProgressUpdate(0, 0, 10, 160, 1.0, bytes_sent=1000, dense_bytes=4000))
    ev.on_progress(ProgressUpdate(1, 0, 10, 160, 3.0, bytes_sent=600, dense_bytes=4000))
    clock.t += 4.0
    ev.on_progress(ProgressUpdate(0, 1, 10, 160, 0.5, bytes_sent=1800, dense_bytes=8000))
    assert rec.of(EpochEvent) == []  # worker 1 is still in epoch 0
    ev.on_progress(ProgressUpdate(1, 1, 10, 160, 0.7, bytes_sent=1000, dense_bytes=8000))
    (e0,) = rec.of(EpochEvent)
    assert e0.epoch == 0 and e0.examples == 320 and e0.seconds == pytest.approx(4.0)
    assert e0.examples_per_second == pytest.approx(80.0)
    assert e0.score == pytest.approx(2.0)  # no agreed score: the workers' last losses of the epoch
    assert (e0.bytes_sent, e0.dense_bytes) == (1600, 8000)
    clock.t += 1.0
    ev.end(None, 0.6)
    e0, e1 = rec.of(EpochEvent)
    assert e1.epoch == 1 and e1.score == pytest.approx(0.6) and (e1.bytes_sent, e1.dense_bytes) == (1200, 8000)
    (ended,) = rec.of(FitEnded)
    assert ended.score == 0.6 and ended.error is None and ended.examples == 640
    assert [type(e).__name__ for e in rec.events][-3:] == ["EpochEvent", "EpochEvent", "FitEnded"]


def test_sharing_epoch_score_closes_the_epoch_and_is_its_score() -> None:
    ev, rec, _, _ = _events()
    ev.start()
    ev.on_progress(ProgressUpdate(0, 0, 10, 160, 9.0))
    ev.on_score(ScoreReport(epoch=0, round=None, examples=512, score=0.25))
    (e0,) = rec.of(EpochEvent)
    assert (e0.score, e0.examples) == (0.25, 512)


def test_averaging_rounds_give_an_example_weighted_epoch_score() -> None:
    ev, rec, _, _ = _events(master=ParameterAveragingTrainingMaster(num_workers=2), epochs=1)
    ev.start()
    ev.on_score(ScoreReport(epoch=0, round=1, examples=300, score=1.0))
    ev.on_score(ScoreReport(epoch=0, round=2, examples=100, score=3.0))
    assert rec.of(EpochEvent) == []  # a round does not end the epoch
    ev.end(None, 3.0)
    (e0,) = rec.of(EpochEvent)
    assert e0.score == pytest.approx(1.5) and e0.examples == 400


def test_a_failed_fit_closes_no_unfinished_epoch_and_reports_the_error() -> None:
    ev, rec, _, _ = _events()
    ev.start()
    ev.on_progress(ProgressUpdate(0, 0, 10, 160, 1.0))
    boom = RuntimeError("worker died")
    ev.end(None, math.nan, error=boom)
    assert rec.of(EpochEvent) == []
    assert rec.of(FitEnded)[0].error is boom


def test_a_failing_listener_does_not_stop_the_others() -> None:
    class Broken(TrainingListener):
        def on_iteration(self, event: IterationEvent) -> None:
            raise ValueError("display broke")

    rec = Recorder()
    ev, _, _, _ = _events(listeners=[Broken(), rec])
    ev.start()
    ev.on_progress(ProgressUpdate(0, 0, 1, 16, 1.0))
    assert len(rec.of(IterationEvent)) == 1


def test_progress_messages_carry_sharing_traffic_optionally() -> None:
    base = {"kind": "progress", "rank": 1, "epoch": 0, "iteration": 3, "examples": 48, "score": 0.5}
    assert progress_from_msg({**base, "bytes_sent": 10, "dense_bytes": 400}).bytes_sent == 10
    old = progress_from_msg(base)
    assert (old.bytes_sent, old.dense_bytes) == (0, 0)
    with pytest.raises(Malformed, match="bytes_sent"):
        progress_from_msg({**base, "bytes_sent": -1})
    with pytest.raises(Malformed, match="dense_bytes"):
        progress_from_msg({**base, "dense_bytes": "many"})


def test_parallel_wrapper_fit_logs_to_mlflow_and_a_failed_fit_marks_the_run_failed(tmp_path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from torchspark import DataSet, datasets
    from torchspark.errors import ConfigError, WorkerError
    from torchspark.listeners.mlflow_listener import MlflowListener
    from torchspark.parallel import ParallelWrapper
    from torchspark.training import InProcessRunner

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    listener = MlflowListener(
        tracking_uri=uri, experiment="pw", run_name="first", tags={"team": "ml"}, log_model=False, log_stats=False
    )
    data = datasets.synthetic_classification(96, 4, 2, seed=0)
    net = Network(models.mlp(4, 8, 2), updater=optim.Adam(lr=1e-2), seed=0)
    wrapper = ParallelWrapper(
        net,
        num_workers=2,
        progress=False,
        runner=InProcessRunner(timeout_s=60),
        training_mode="averaging",
        averaging_frequency=2,
        collect_training_stats=True,
    )
    wrapper.add_training_listener(listener)
    wrapper.fit(data, epochs=2, batch_size=8)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(listener.run_id)
    assert run.info.status == "FINISHED" and run.data.params["master.type"] == "averaging"
    assert run.info.run_name == "first" and run.data.tags["team"] == "ml"
    assert run.info.experiment_id == client.get_experiment_by_name("pw").experiment_id
    epochs = sorted((m.step, m.value) for m in client.get_metric_history(listener.run_id, "epoch_examples"))
    assert epochs == [(0, 96.0), (1, 96.0)]
    assert wrapper.training_stats is not None
    assert client.list_artifacts(listener.run_id) == []  # log_model=False, log_stats=False
    # labels out of range only after the first minibatch (the driver checks the first): a worker fails
    bad = DataSet(data.features[:32], torch.full((32,), 7))
    with pytest.raises(WorkerError):
        wrapper.fit([data.slice(0, 64), bad], epochs=1, batch_size=8)
    assert client.get_run(listener.run_ids[-1]).info.status == "FAILED"
    with pytest.raises(ConfigError, match="add_progress_listener"):
        wrapper.add_training_listener(print)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="log_every"):
        MlflowListener(tracking_uri=uri, log_every=-1)


def test_tensorboard_every_option_thins_the_iteration_scalars(tmp_path) -> None:
    pytest.importorskip("tensorboardX")
    from torchspark.errors import ConfigError
    from torchspark.listeners.tensorboard_listener import TensorBoardListener, read_scalars

    all_reports, every_third = TensorBoardListener(tmp_path / "a"), TensorBoardListener(tmp_path / "b", every=3)
    ev, _, _, _ = _events(listeners=[all_reports, every_third], workers=1)
    ev.start()
    for i in range(1, 7):
        ev.on_progress(ProgressUpdate(0, 0, i, 8 * i, 1.0 / i, bytes_sent=10 * i, dense_bytes=400 * i))
    ev.end(None, 1 / 6)
    all_reports.close()
    every_third.close()
    a, b = read_scalars(tmp_path / "a"), read_scalars(tmp_path / "b")
    assert [s for s, _ in a["train/score"]] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in b["train/score"]] == [1, 4]
    assert a["sharing/compression"][0][1] == pytest.approx(40.0)
    assert [s for s, _ in a["epoch/score"]] == [0, 1]
    with pytest.raises(ConfigError, match="every"):
        TensorBoardListener(tmp_path / "c", every=0)


def test_mlflow_tracking_uris_go_to_mlflow_and_only_paths_are_directories(tmp_path, monkeypatch) -> None:
    """``databricks`` (the docstring's own example) once became a ./databricks directory; URIs MLflow resolves are
    passed through untouched, and only a plain path or a file: URI is made as a directory."""
    pytest.importorskip("mlflow")
    from torchspark.listeners.mlflow_listener import MlflowListener, local_store_path, uri_scheme

    monkeypatch.chdir(tmp_path)
    for uri in ["databricks", "databricks://my-profile"]:
        listener = MlflowListener(tracking_uri=uri)
        assert listener.client._tracking_client.tracking_uri == uri
        assert local_store_path(uri) is None
    assert os.listdir(tmp_path) == []  # nothing was created for them
    assert uri_scheme("sqlite:///x.db") == "sqlite" and uri_scheme("postgresql+psycopg2://h/db") == "postgresql"
    assert local_store_path("sqlite:///x.db") is None and local_store_path("https://h:5000") is None
    assert local_store_path((tmp_path / "m r").as_uri()) == str(tmp_path / "m r")
    assert local_store_path("runs/mlruns") == "runs/mlruns" and local_store_path("C:\\mlruns") == "C:\\mlruns"

    # mlflow-skinny alone (no SQLAlchemy): a sqlite store is refused with the install that brings it
    import importlib.util

    from torchspark.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sqlalchemy" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs sqlalchemy .*pip install 'torchspark\[mlflow\]'"):
        MlflowListener(tracking_uri="sqlite:///mlflow.db")
    assert os.listdir(tmp_path) == []


def test_mlflow_local_stores_work_as_documented_or_fail_at_construction_with_the_fix(tmp_path, monkeypatch) -> None:
    """The [mlflow] extra's sqlite store works with no settings; a file store without MLflow 3's opt-in fails
    when the listener is built, naming the variable and the sqlite alternative, not after the fit."""
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    from torchspark.errors import ConfigError
    from torchspark.listeners.mlflow_listener import MlflowListener

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)  # a sqlite store's artifacts go to ./mlruns (MLflow's default artifact root)
    with pytest.raises(ConfigError, match="MLFLOW_ALLOW_FILE_STORE=true.*sqlite:///mlflow.db"):
        MlflowListener(tracking_uri=(tmp_path / "mlruns").as_uri())
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    listener = MlflowListener(tracking_uri=uri, experiment="local", log_stats=False)
    net = Network(models.mlp(3, 4, 2), seed=0)
    from torchspark.parallel import ParallelWrapper
    from torchspark.training import InProcessRunner

    wrapper = ParallelWrapper(net, num_workers=1, progress=False, runner=InProcessRunner(timeout_s=60))
    wrapper.add_training_listener(listener)
    from torchspark import datasets

    wrapper.fit(datasets.synthetic_classification(32, 3, 2, seed=1), epochs=1, batch_size=8)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(listener.run_id)
    assert run.info.status == "FINISHED" and "mlflow.parentRunId" not in run.data.tags  # no active run: top level
    assert {a.path for a in client.list_artifacts(listener.run_id)} == {"model", "torchspark-network"}
    assert (tmp_path / "mlruns").is_dir()
