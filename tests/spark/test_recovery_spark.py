"""Automatic recovery on Spark with real processes: kill -9 one training worker's Python process mid-fit on
``local[2]`` (both masters); the driver relaunches the barrier stage and the fit completes. What happened is named
(worker, Spark's reason) in the error and in the stats."""

from __future__ import annotations

import gc
import json
import os
import signal
import threading

import pytest
from _faults import Fault
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException

from helpers import lenet_net
from torchspark import Network, datasets, models, optim
from torchspark.errors import TorchSparkError, WorkerLost
from torchspark.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkNetwork
from torchspark.spark.broadcasts import driver_broadcast_files
from torchspark.training.waiting import join_within, wait_until

EPOCHS = 3


def _masters(**kw):
    common = dict(
        batch_size_per_worker=16, num_workers=2, rng_seed=0, collect_training_stats=True, rendezvous_timeout_s=20, **kw
    )
    return {
        "averaging": ParameterAveragingTrainingMaster(averaging_frequency=5, **common),
        "sharing": SharedTrainingMaster(**common),
    }


def _fit(spark, sc, master, fault=None):
    train = datasets.digits("train")
    net = lenet_net(updater=optim.Adam(lr=1e-3))
    spark_net = SparkNetwork(spark, net, master, progress=False)
    if fault is not None:
        spark_net.add_progress_listener(fault)
    try:
        spark_net.fit(sc.parallelize(train.split(64), 2), epochs=EPOCHS)
    finally:
        spark_net.delete_temp_files()
    return net, spark_net


@pytest.fixture(scope="module")
def undisturbed(spark, sc) -> dict[str, float]:
    test = datasets.digits("test")
    return {name: _fit(spark, sc, master)[0].evaluate(test).accuracy() for name, master in _masters().items()}


@pytest.mark.parametrize("name", ["averaging", "sharing"])
def test_a_killed_python_worker_is_relaunched_and_the_fit_completes(spark, sc, name, undisturbed, leftovers) -> None:
    fault = Fault(signal.SIGKILL)
    net, spark_net = _fit(spark, sc, _masters()[name], fault)
    leftovers.assert_clean(gone=fault.hit, pids=fault.all_pids)

    assert len(fault.hit) == 1 and len(fault.seen) == 2  # rank 1's first process killed, a second one finished
    accuracy = net.evaluate(datasets.digits("test")).accuracy()
    assert abs(accuracy - undisturbed[name]) <= 0.02, (accuracy, undisturbed[name])
    assert net.epoch == EPOCHS
    summary = spark_net.training_stats.summary()
    [failure] = summary["failures"]
    assert failure["attempt"] == 0 and failure["rank"] == 1 and failure["pid"] == fault.hit[0]
    assert failure["exit_status"] is not None, failure  # Spark gives no code for a killed Python worker: "crashed"
    _assert_sparks_words(failure["reason"])
    assert summary["recovered_from"]["attempt"] == 1
    assert summary["examples"] == EPOCHS * 1437


def test_without_retries_the_error_names_the_worker_and_sparks_reason(spark, sc, leftovers) -> None:
    fault = Fault(signal.SIGKILL, epoch=0)
    with pytest.raises(WorkerLost) as info:
        _fit(spark, sc, _masters(max_failures=0)["averaging"], fault)
    leftovers.assert_clean(gone=fault.hit, pids=fault.all_pids)

    message = str(info.value)
    assert message.startswith("attempt 0: worker 1 "), message  # the lost worker, also when Spark names a peer
    assert "torchspark fit: 2 workers, 3 epoch(s): " in message
    _assert_sparks_words(message)
    assert "java.base/java.lang.Thread.run" not in message.splitlines()[0]
    assert "max_failures=0" in message and f"pid {fault.hit[0]}" in message
    assert info.value.__cause__ is not None  # Spark's exception stays chained
    assert info.value.rank == 1


def _assert_sparks_words(text: str) -> None:
    """Spark's own reason: the crashed Python worker, or (when Spark reports the peer first, a race) the peer's
    last line as it saw the loss; never a Java stack frame."""
    assert "Stage failed because barrier task ResultTask(" in text, text
    assert "Python worker exited unexpectedly" in text or " saw: " in text, text
    assert "\tat " not in text.split("--- a peer's traceback")[0], text


#: an MLP of about 300k parameters: a task broadcast of about 1.2 MB, far above Spark's own small blocks
LEAK_HIDDEN = [512, 512]


def test_recoveries_leave_nothing_behind_on_the_driver(spark, sc, undisturbed, leftovers) -> None:
    """Issue 31 ("driver and JVM memory grow over 7 recoveries"): each attempt broadcasts its task (the weights),
    opens a progress server and a relay and runs a barrier stage under its own job group and watchdog; after a fit
    that recovered twice the driver is back where it was (``undisturbed``'s fits were the warm-up): no broadcast
    held (PySpark's files, the JVM's blocks), no persisted RDD, no thread, socket or listening port of the fit, no
    exception kept (a traceback holds frames, frames hold tensors), failure records as plain JSON. Counts only."""
    kills = 2
    before, storage_before = _driver_state(sc), _storage_used(sc)
    threads_before = set(threading.enumerate())
    fault = Fault(signal.SIGKILL, epoch=0, times=kills)
    master = ParameterAveragingTrainingMaster(
        averaging_frequency=5,
        batch_size_per_worker=32,
        num_workers=2,
        rng_seed=0,
        collect_training_stats=True,
        rendezvous_timeout_s=20,
        max_failures=kills,
    )
    spark_net = SparkNetwork(spark, Network(models.mlp(64, LEAK_HIDDEN, 10), seed=0), master, progress=False)
    spark_net.add_progress_listener(fault)
    try:
        spark_net.fit(sc.parallelize(datasets.digits("train").split(64), 2), epochs=1)
    finally:
        spark_net.delete_temp_files()
    leftovers.assert_clean(gone=fault.hit, pids=fault.all_pids)
    failures = spark_net.training_stats.summary()["failures"]
    assert len(failures) == kills, failures

    new_threads = [t for t in set(threading.enumerate()) - threads_before if t.name != "background-lane"]
    assert not [t.name for t in join_within(new_threads, 10.0)]  # the fit's threads have ended
    assert _driver_state(sc) == before
    blueprint = 4 * sum(w.numel() for w in models.mlp(64, LEAK_HIDDEN, 10).parameters())
    assert _storage_back(sc, storage_before + blueprint // 2), (_storage_used(sc), storage_before)  # JVM's copies
    assert json.loads(json.dumps(failures)) == failures  # plain data: no exception, traceback or tensor


def _socket_inodes() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _listening_ports() -> list[int]:
    """TCP ports this process listens on (its socket inodes matched against /proc/net/tcp*)."""
    inodes, ports = _socket_inodes(), []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            for line in open(table).read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _storage_used(sc) -> int:
    """Bytes of the driver's block-manager storage in use (local mode: the only one): broadcast and RDD blocks."""
    status = sc._jsc.sc().getExecutorMemoryStatus().iterator()
    used = 0
    while status.hasNext():
        limits = status.next()._2()
        used += limits._1() - limits._2()
    return used


def _storage_back(sc, at_most: int) -> bool:
    """Whether the driver's storage in use falls to ``at_most`` within 30 s (Spark removes a destroyed broadcast's
    blocks in the background; a JVM collection lets its ContextCleaner drop the stages' own task binaries)."""

    def back() -> bool:
        sc._jvm.java.lang.System.gc()
        return _storage_used(sc) <= at_most

    return wait_until(back, 30.0, poll_s=0.2)


def _live(*classes: type) -> int:
    """Objects of ``classes`` alive now (by ``type``: an ``isinstance`` hook of a scanned object never runs)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), classes))


def _driver_state(sc) -> dict:
    gc.collect()  # what only garbage held (a py4j connection of an ended thread) is released first
    return {
        "broadcast files": driver_broadcast_files(sc),
        "persisted RDDs": sc._jsc.getPersistentRDDs().size(),
        "sockets": len(_socket_inodes()),
        "listening ports": _listening_ports(),
        "errors of the attempts": _live(TorchSparkError, Py4JError, PySparkException),
    }
