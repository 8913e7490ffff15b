"""The directory progress channel on a Spark Connect session (for a client the executors cannot connect to),
forced on the local Connect server: listeners, the bar's updates and the watchdog's liveness come from files the
workers write and the client polls; a worker's traceback comes back through them too."""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
from pathlib import Path

import cloudpickle
import pytest

import hanging
import interrupting
from hanging import HangingMLP
from helpers import mlp_net
from interrupting import InterruptingMLP
from torchspark import Network, datasets, optim
from torchspark.errors import ConfigError, WorkerError
from torchspark.listeners import EpochEvent, FitEnded, IterationEvent, TrainingListener
from torchspark.spark import SharedTrainingMaster, SparkNetwork

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark"))
from _faults import Fault  # noqa: E402  (tests/spark's fault injector)

cloudpickle.register_pickle_by_value(interrupting)
cloudpickle.register_pickle_by_value(hanging)

BATCH = 8


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


def frame(spark, n: int, seed: int):
    data = datasets.synthetic_classification(n, 12, 3, seed=seed)
    rows = [(x.double().tolist(), int(y)) for x, y in zip(data.features, data.labels)]
    return spark.createDataFrame(rows, "features array<double>, label long")


def chunks(root: Path) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(str(root / "**" / "rank-*.jsonl"), recursive=True))


def test_listeners_are_fed_from_the_polled_directory_and_it_is_removed_after_the_fit(connect_spark, tmp_path) -> None:
    root = tmp_path / "progress"
    master = SharedTrainingMaster(batch_size_per_worker=BATCH, num_workers=2, rng_seed=0)
    spark_net = SparkNetwork(
        connect_spark,
        mlp_net(12, 16, 3, updater=optim.SGD(lr=0.1)),
        master,
        progress=False,
        progress_channel="directory",
        progress_directory=str(root),
        progress_poll_s=0.2,
    )
    rec = Recorder()
    spark_net.add_training_listener(rec)
    seen: list[list[str]] = []
    spark_net.add_progress_listener(lambda update: seen.append(chunks(root)))  # what the workers wrote so far
    spark_net.fit(frame(connect_spark, 96, seed=1), epochs=2)

    assert [(e.epoch, e.examples) for e in rec.epochs] == [(0, 96), (1, 96)]
    assert rec.iterations and rec.iterations[-1].examples == 192
    assert {e.rank for e in rec.iterations} == {0, 1}
    assert len(rec.ended) == 1 and rec.ended[0].error is None
    # every update came out of a chunk file of ranks 0 and 1: the channel was the directory, not TCP
    assert seen and all(seen) and {name[:10] for name in seen[-1]} == {"rank-00000", "rank-00001"}
    assert os.listdir(root) == []  # the fit's directory is gone after it succeeded


def test_a_killed_worker_is_named_from_the_directorys_heartbeats_and_recovered(connect_spark, tmp_path) -> None:
    """Progress (with each worker's pid) reaches the client only through the files: the fault listener kills rank 1's
    Python worker from them (the workers wait at their 12th minibatch until it did, so the kill hits a running
    worker), the driver names the lost rank and its pid from what it read, recovers from the checkpoint; the failed
    attempt's files stay (under the run's checkpoint directory, the default location), the successful attempt's
    are removed."""
    ckpt, marker = tmp_path / "ckpt", tmp_path / "killed-once"
    master = SharedTrainingMaster(
        batch_size_per_worker=BATCH,
        num_workers=2,
        rng_seed=0,
        collect_training_stats=True,
        rendezvous_timeout_s=60,
        max_failures=1,
        checkpoint_directory=str(ckpt),
        checkpoint_every=2,
    )
    net = Network(HangingMLP(12, 16, 3, marker=str(marker), after=11), updater=optim.SGD(lr=0.1), seed=0)
    spark_net = SparkNetwork(
        connect_spark, net, master, progress=False, progress_channel="directory", progress_poll_s=0.2
    )
    fault = Fault(signal.SIGKILL, epoch=0)

    def kill_then_release(update) -> None:
        fault(update)
        if fault.hit:
            marker.touch()  # the next attempt's workers do not wait

    spark_net.add_progress_listener(kill_then_release)
    spark_net.fit(frame(connect_spark, 128, seed=2), epochs=2, run_id="killed")

    assert len(fault.hit) == 1 and net.epoch == 2
    summary = spark_net.training_stats.summary()
    [failure] = summary["failures"]
    assert failure["rank"] == 1 and failure["pid"] == fault.hit[0]  # from the files' heartbeats and progress
    assert summary["recovered_from"]["attempt"] == 1
    attempts = sorted(os.path.basename(p) for p in glob.glob(str(ckpt / "killed" / "progress" / "fit-*")))
    assert len(attempts) == 1 and attempts[0].endswith("-a0")


def test_a_workers_error_comes_back_as_the_root_cause_and_its_files_stay(connect_spark, tmp_path) -> None:
    root = tmp_path / "progress"
    master = SharedTrainingMaster(batch_size_per_worker=BATCH, num_workers=2)
    net = Network(InterruptingMLP(12, 16, 3, after=3), updater=optim.Adam(lr=0.01), seed=0)
    spark_net = SparkNetwork(
        connect_spark,
        net,
        master,
        progress=False,
        progress_channel="directory",
        progress_directory=str(root),
        progress_poll_s=0.2,
    )
    with pytest.raises(WorkerError, match="worker stopped after 3 minibatches") as info:
        spark_net.fit(frame(connect_spark, 96, seed=3), epochs=1)
    assert "interrupting.py" in str(info.value)
    [kept] = os.listdir(root)  # a failed fit's files stay for reading
    errors = [
        json.loads(line)
        for p in glob.glob(str(root / kept / "rank-*.jsonl"))
        for line in Path(p).read_text().splitlines()
        if '"error"' in line
    ]
    # the worker that stopped reports its error; a peer may report first what it saw of that (PeerLost)
    assert any("Interrupted: worker stopped after 3 minibatches" in e["traceback"] for e in errors), errors
    assert all("Interrupted" in e["traceback"] or "PeerLost" in e["traceback"] for e in errors), errors


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"progress_channel": "sockets"}, "progress_channel must be one of"),
        ({"progress_poll_s": -1}, "progress_poll_s must be a number of seconds"),
        ({"progress_channel": "none", "progress_directory": "/tmp/p"}, "unused with progress_channel='none'"),
    ],
)
def test_bad_progress_settings_are_refused(connect_spark, kwargs, words) -> None:
    with pytest.raises(ConfigError, match=words):
        SparkNetwork(connect_spark, mlp_net(12, 16, 3), SharedTrainingMaster(num_workers=2), **kwargs)


def test_the_directory_channel_without_a_directory_names_the_settings(connect_spark) -> None:
    spark_net = SparkNetwork(
        connect_spark,
        mlp_net(12, 16, 3),
        SharedTrainingMaster(num_workers=2),
        progress=False,
        progress_channel="directory",
    )
    with pytest.raises(ConfigError, match="progress_directory=.*checkpoint_directory"):
        spark_net.fit(frame(connect_spark, 32, seed=4))
