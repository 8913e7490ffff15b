"""TrainingEvents: the progress channel's per-worker messages become fit-wide listener events."""

from __future__ import annotations

import math

import pytest

from torchspark import Network, models, optim
from torchspark.listeners import EpochEvent, FitEnded, FitStarted, IterationEvent, TrainingEvents, TrainingListener
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster
from torchspark.training.hooks import ProgressUpdate, ScoreReport
from torchspark.training.progress.wire import Malformed, progress_from_msg


class Recorder(TrainingListener):
    def __init__(self) -> None:
        self.events: list[object] = []

    def on_fit_start(self, event: FitStarted) -> None:
        self.events.append(event)

    def on_iteration(self, event: IterationEvent) -> None:
        self.events.append(event)

    def on_epoch_end(self, event: EpochEvent) -> None:
        self.events.append(event)

    def on_fit_end(self, event: FitEnded) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
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
    ev = TrainingEvents(listeners if listeners is not None else [rec], runner="test", master=master, network=net,
                        epochs=epochs, num_workers=workers, clock=clock)
    return ev, rec, clock, net


def test_fit_start_carries_master_and_network_settings() -> None:
    ev, rec, _, net = _events(master=ParameterAveragingTrainingMaster(averaging_frequency=7, num_workers=2),
                              start=(40, 3))
    ev.start()
    (started,) = rec.of(FitStarted)
    assert started.master["type"] == "parameter_averaging" and started.master["averaging_frequency"] == 7
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
