"""Listeners run off the thread that reads the workers and cannot keep a fit from returning (issue 31)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from torchspark import Network, datasets, models, optim
from torchspark.errors import ConfigError
from torchspark.listeners import FitEnded, IterationEvent, TrainingEvents, TrainingListener
from torchspark.listeners.hub import HUNG_CALL_S
from torchspark.spark import SharedTrainingMaster
from torchspark.training.hooks import ProgressUpdate
from torchspark.training.progress import ProgressClient, ProgressServer


def _until(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_blocked_progress_listener_does_not_stop_the_server_reading_heartbeats() -> None:
    entered, release = threading.Event(), threading.Event()

    def stuck(update: ProgressUpdate) -> None:
        entered.set()
        release.wait(60)  # a tracking server that stopped answering

    server = ProgressServer(listeners=[stuck]).start()
    try:
        with ProgressClient.to(server.endpoint, rank=0).connect() as client:
            client.send(ProgressUpdate(0, 0, 1, 8, 1.0))
            assert entered.wait(30)
            client.send(ProgressUpdate(0, 0, 2, 16, 0.5))
            # the serving thread still reads: the second report (and so every heartbeat) arrives
            assert _until(lambda: 0 in server.latest() and server.latest()[0].iteration == 2)
    finally:
        release.set()
        server.close()


class _Recorder(TrainingListener):
    def __init__(self) -> None:
        self.events: list[object] = []

    def on_iteration(self, event: IterationEvent) -> None:
        self.events.append(event)

    def on_fit_end(self, event: FitEnded) -> None:
        self.events.append(event)


class _Stuck(TrainingListener):
    end_timeout_s = 0.5

    def __init__(self) -> None:
        self.release = threading.Event()

    def on_iteration(self, event: IterationEvent) -> None:
        self.release.wait(120)

    def on_fit_end(self, event: FitEnded) -> None:
        self.release.wait(120)


def test_a_stuck_training_listener_neither_blocks_the_others_nor_the_end_of_the_fit() -> None:
    stuck, rec = _Stuck(), _Recorder()
    net = Network(models.mlp(4, 4, 2), updater=optim.Adam(lr=1e-3), seed=0)
    events = TrainingEvents(
        [stuck, rec], runner="test", master=SharedTrainingMaster(num_workers=1), network=net, epochs=1, num_workers=1
    )
    done = threading.Event()

    def fit() -> None:
        events.start()
        events.on_progress(ProgressUpdate(0, 0, 1, 8, 1.0))  # returns at once: the stuck listener has its thread
        events.end(net, 1.0)
        done.set()

    try:
        threading.Thread(target=fit, daemon=True).start()
        assert done.wait(60), "end() waited for a stuck listener beyond its end_timeout_s"
        assert [type(e).__name__ for e in rec.events] == ["IterationEvent", "FitEnded"]
    finally:
        stuck.release.set()


class _HungServer(TrainingListener):
    """A listener whose tracking server stopped answering: its first call of a fit blocks until released."""

    end_timeout_s = 3600.0  # the full wait: never reached when the listener is known hung
    hung_end_timeout_s = 0.2

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def on_fit_start(self, event: object) -> None:
        self.entered.set()
        self.release.wait(120)


def _hung_fit(listener: TrainingListener, stuck_for_s: float, caplog: pytest.LogCaptureFixture) -> bool:
    """One fit's events on a fake clock: the listener's first call has run ``stuck_for_s`` when the fit ends.
    True when end() returned (within 60 s, far below the listener's end_timeout_s)."""
    now = [0.0]
    net = Network(models.mlp(4, 4, 2), updater=optim.Adam(lr=1e-3), seed=0)
    events = TrainingEvents(
        [listener],
        runner="test",
        master=SharedTrainingMaster(num_workers=1),
        network=net,
        epochs=1,
        num_workers=1,
        clock=lambda: now[0],
    )
    events.start()
    assert listener.entered.wait(30)  # type: ignore[attr-defined]
    now[0] += stuck_for_s
    done = threading.Event()
    with caplog.at_level("WARNING", logger="torchspark.listeners.hub"):
        threading.Thread(target=lambda: (events.end(net, 1.0), done.set()), daemon=True).start()
        return done.wait(60)


def test_a_listener_seen_hung_is_waited_for_hung_end_timeout_s_not_end_timeout_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A listener stuck since the start of the fit in one call (an MLflow server that stopped answering) is seen
    hung: the end waits its hung_end_timeout_s, not its end_timeout_s; the next fit, which it hangs in again, is
    not waited for in full either, however short it was."""
    listener = _HungServer()
    try:
        assert _hung_fit(listener, HUNG_CALL_S + 1.0, caplog), "end() waited the full end_timeout_s for a hung listener"
        assert "waits hung_end_timeout_s=0.2 s for it, not end_timeout_s=3600 s" in caplog.text
        caplog.clear()
        listener.entered.clear()
        assert _hung_fit(listener, 1.0, caplog), "the next fit's end waited the full end_timeout_s again"
        assert "hung_end_timeout_s=0.2" in caplog.text
    finally:
        listener.release.set()


def test_a_listener_merely_slow_at_the_end_gets_its_full_end_timeout_s(caplog: pytest.LogCaptureFixture) -> None:
    listener = _HungServer()
    listener.end_timeout_s = 0.3
    try:
        assert _hung_fit(listener, 1.0, caplog)  # one call of 1 s when the fit ends: not seen hung
        assert "hung_end_timeout_s" not in caplog.text
        assert "a listener was still running" in caplog.text  # given up after its whole end_timeout_s
    finally:
        listener.release.set()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_listener_refuses_an_unreachable_tracking_server_at_once() -> None:
    pytest.importorskip("mlflow")
    from torchspark.listeners.mlflow_listener import MlflowListener

    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ConfigError, match=f"{uri}.*not reachable"):
        MlflowListener(tracking_uri=uri)


def test_mlflow_server_that_stops_answering_does_not_keep_fit_from_returning() -> None:
    pytest.importorskip("mlflow")
    from torchspark.listeners.mlflow_listener import MlflowListener
    from torchspark.parallel import ParallelWrapper
    from torchspark.training import InProcessRunner

    silent = socket.socket()  # accepts connections (the kernel's backlog) and never answers a request
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        listener = MlflowListener(tracking_uri=f"http://127.0.0.1:{silent.getsockname()[1]}", end_timeout_s=1.0)
        data = datasets.synthetic_classification(32, 4, 2, seed=0)
        net = Network(models.mlp(4, 8, 2), updater=optim.Adam(lr=1e-2), seed=0)
        wrapper = ParallelWrapper(
            net, num_workers=1, progress=False, runner=InProcessRunner(timeout_s=60), training_mode="averaging"
        )
        wrapper.add_training_listener(listener)
        outcome: list[object] = []
        worker = threading.Thread(target=lambda: outcome.append(wrapper.fit(data, epochs=1, batch_size=8)), daemon=True)
        worker.start()
        worker.join(90)  # MLflow alone would retry for minutes; the listener's end_timeout_s bounds it
        assert not worker.is_alive() and outcome, "fit() did not return while the tracking server was silent"
        assert net.epoch == 1
    finally:
        silent.close()


def test_listeners_at_unusable_paths_fail_at_construction(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    pytest.importorskip("tensorboardX")
    from torchspark.listeners.tensorboard_listener import TensorBoardListener

    with pytest.raises(ConfigError, match="a-file"):
        TensorBoardListener(blocker / "logs")
    pytest.importorskip("mlflow")
    from torchspark.listeners.mlflow_listener import MlflowListener

    with pytest.raises(ConfigError, match="a-file"):
        MlflowListener(tracking_uri=(blocker / "mlruns").as_uri())
