"""Automatic recovery with real worker processes: a worker killed (SIGKILL) or stopped (SIGSTOP) mid-fit is
relaunched and the fit completes; user errors are not retried; max_failures bounds the retries."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import threading
from functools import partial

import pytest
import torch
from _faulty import FailingForward, HangingForward

from hanging import HangingMLP
from helpers import lenet_net
from torchspark import Network, datasets, optim
from torchspark.errors import WorkerError, WorkerLost
from torchspark.parallel import LocalProcessRunner, ParallelWrapper
from torchspark.training.config.masters import ParameterAveragingTrainingMaster
from torchspark.training.config.shared_master import SharedTrainingMaster

_lenet = partial(lenet_net, updater=optim.Adam(lr=1e-3))


def _worker_children() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("torchspark-worker")]


class _Fault:
    """A progress listener that sends ``sig`` to rank 1's process once it reports from epoch ``epoch`` on (the
    first ``times`` worker-1 processes seen, one each): the OOM killer or a frozen host, from the outside."""

    def __init__(self, sig: int, epoch: int = 1, times: int = 1) -> None:
        self.sig, self.epoch, self.times = sig, epoch, times
        self.hit: list[int] = []
        self.seen: set[int] = set()
        self.all_pids: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, update) -> None:
        with self._lock:
            if update.pid is None:
                return
            self.all_pids.add(update.pid)
            if update.rank != 1:
                return
            self.seen.add(update.pid)
            if update.epoch >= self.epoch and len(self.hit) < self.times and update.pid not in self.hit:
                self.hit.append(update.pid)
                os.kill(update.pid, self.sig)


EPOCHS = 3
MASTERS = {
    "averaging": ParameterAveragingTrainingMaster(
        averaging_frequency=5, rng_seed=0, collect_training_stats=True, rendezvous_timeout_s=20
    ),
    "sharing": SharedTrainingMaster(rng_seed=0, collect_training_stats=True, rendezvous_timeout_s=20),
}


@pytest.fixture(scope="module")
def undisturbed() -> dict[str, float]:
    """Test accuracy of the same fits without a fault (the noise reference), per master; ``params-<name>``: the
    parameters the fit ends with."""
    train, test = datasets.digits("train"), datasets.digits("test")
    found = {}
    for name, master in MASTERS.items():
        net = _lenet()
        ParallelWrapper(net, num_workers=2, master=master, progress=False).fit(train, epochs=EPOCHS, batch_size=16)
        found[name] = net.evaluate(test).accuracy()
        found[f"params-{name}"] = net.params().clone()
    return found


@pytest.mark.parametrize("name", sorted(MASTERS))
def test_a_killed_worker_is_relaunched_and_the_fit_completes(name, leftovers, undisturbed) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = _lenet()
    fault = _Fault(signal.SIGKILL)
    wrapper = ParallelWrapper(net, num_workers=2, master=MASTERS[name], progress=False)
    wrapper.add_progress_listener(fault)
    wrapper.fit(train, epochs=EPOCHS, batch_size=16)
    leftovers.assert_clean(gone=fault.all_pids)
    assert not _worker_children()

    assert len(fault.hit) == 1 and len(fault.seen) == 2  # one worker-1 process killed, a new one finished
    accuracy = net.evaluate(test).accuracy()
    assert abs(accuracy - undisturbed[name]) <= 0.02, (accuracy, undisturbed[name])
    assert net.epoch == EPOCHS
    summary = wrapper.training_stats.summary()
    [failure] = summary["failures"]
    assert failure["attempt"] == 0 and failure["rank"] == 1 and failure["exit_status"] == "signal SIGKILL"
    assert failure["pid"] == fault.hit[0] and "torchspark-worker-1" in failure["executor"]
    assert failure["reached_epoch"] >= 1  # the fault came in epoch 1: that work was lost and redone
    assert summary["recovered_from"] == {"attempt": 1, "epoch": 0, "iteration": 0, "checkpoint": None}
    assert summary["examples"] == EPOCHS * 1437  # the successful attempt trained every epoch once


def test_with_checkpoints_recovery_loses_at_most_one_interval(tmp_path, leftovers, undisturbed) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = _lenet()
    fault = _Fault(signal.SIGKILL, epoch=1)  # in the second epoch: the first epoch's checkpoint is complete
    master = dataclasses.replace(MASTERS["averaging"], checkpoint_directory=str(tmp_path))  # once per epoch
    wrapper = ParallelWrapper(net, num_workers=2, master=master, progress=False)
    wrapper.add_progress_listener(fault)
    wrapper.fit(train, epochs=EPOCHS, batch_size=16)
    leftovers.assert_clean(gone=fault.all_pids)

    summary = wrapper.training_stats.summary()
    [failure] = summary["failures"]
    recovered = summary["recovered_from"]
    assert recovered["checkpoint"] is not None and recovered["checkpoint"].startswith(str(tmp_path)), recovered
    # restarted from the checkpoint written at the end of the epoch before the failure: only the failed epoch's
    # part up to the fault was lost (less than one checkpoint interval), not the epochs before it
    assert recovered["epoch"] == failure["reached_epoch"] == 1, (recovered, failure)
    assert recovered["iteration"] > 0
    accuracy = net.evaluate(test).accuracy()
    assert abs(accuracy - undisturbed["averaging"]) <= 0.02, (accuracy, undisturbed["averaging"])
    # resuming continues the same dynamics: the parameters are those of the undisturbed fit
    torch.testing.assert_close(net.params(), undisturbed["params-averaging"], rtol=1e-4, atol=1e-5)


def test_a_stopped_worker_makes_its_peers_give_up_and_the_fit_recovers(leftovers, undisturbed) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = _lenet()
    fault = _Fault(signal.SIGSTOP)
    master = ParameterAveragingTrainingMaster(
        averaging_frequency=5, rng_seed=0, collect_training_stats=True, rendezvous_timeout_s=5
    )
    wrapper = ParallelWrapper(net, num_workers=2, master=master, progress=False)
    wrapper.add_progress_listener(fault)
    wrapper.fit(train, epochs=EPOCHS, batch_size=16)
    leftovers.assert_clean(gone=fault.all_pids)
    assert not _worker_children()

    assert len(fault.hit) == 1
    accuracy = net.evaluate(test).accuracy()
    assert abs(accuracy - undisturbed["averaging"]) <= 0.02, (accuracy, undisturbed["averaging"])
    [failure] = wrapper.training_stats.summary()["failures"]
    assert failure["rank"] == 1 and failure["exit_status"] in ("no response", "no heartbeat"), failure


def test_max_failures_bounds_the_retries_and_names_every_failure(leftovers) -> None:
    train = datasets.digits("train")
    fault = _Fault(signal.SIGKILL, epoch=0, times=5)  # kills worker 1 of every attempt
    master = ParameterAveragingTrainingMaster(
        averaging_frequency=5, rng_seed=0, max_failures=1, rendezvous_timeout_s=20
    )
    wrapper = ParallelWrapper(_lenet(), num_workers=2, master=master, progress=False)
    wrapper.add_progress_listener(fault)
    with pytest.raises(WorkerLost) as info:
        wrapper.fit(train, epochs=3, batch_size=16)
    leftovers.assert_clean(gone=fault.all_pids)

    message = str(info.value)
    assert len(fault.hit) == 2
    assert "max_failures=1" in message and "2 time(s)" in message
    assert "attempt 0: worker 1" in message and "attempt 1: worker 1" in message
    assert message.count("signal SIGKILL") >= 2
    assert str(fault.hit[0]) in message and str(fault.hit[1]) in message  # each lost process by pid


def test_the_users_error_is_not_retried() -> None:
    data = datasets.synthetic_classification(96, 12, 3, seed=1)
    net = Network(FailingForward(12, 3, after=4, rank=1), updater=optim.SGD(lr=0.1), seed=0)
    runner = _CountingRunner(["cpu", "cpu"], threads_per_worker=1)
    wrapper = ParallelWrapper(
        net, num_workers=2, training_mode="averaging", averaging_frequency=1, progress=False, runner=runner
    )  # max_failures=3 (the default)
    with pytest.raises(WorkerError) as info:
        wrapper.fit(data, epochs=1, batch_size=4)
    assert not isinstance(info.value, WorkerLost)
    assert str(info.value).startswith("worker 1 failed: _faulty.InjectedFailure")
    assert runner.runs == 1  # one launch: the same code on the same data would fail the same way again


class _CountingRunner(LocalProcessRunner):
    """The real local-process runner, counting its launches."""

    runs = 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return super().run(*args, **kwargs)


def test_a_hang_at_the_same_step_in_two_attempts_is_not_retried_again(leftovers) -> None:
    data = datasets.synthetic_classification(400, 12, 3, seed=1)  # 50 steps per worker: progress at 10, 20, ...
    net = Network(HangingForward(12, 3, after=25, rank=1), updater=optim.SGD(lr=0.1), seed=0)
    master = ParameterAveragingTrainingMaster(averaging_frequency=1, rendezvous_timeout_s=3)  # max_failures=3
    # a runner of our own, without a timeout_s: it takes the master's 3 s (with its own 300 s the 15 s hang would
    # simply pass and the fit succeed)
    runner = _CountingRunner(["cpu", "cpu"])
    wrapper = ParallelWrapper(net, num_workers=2, master=master, progress=False, runner=runner)
    with pytest.raises(WorkerError) as info:
        wrapper.fit(data, epochs=1, batch_size=4)
    assert not isinstance(info.value, WorkerLost)  # the user's code hangs: not a lost machine
    message = str(info.value)
    # stopped after the second attempt, not after max_failures + 1 = 4
    assert message.startswith("attempts 0 and 1 both stopped at epoch 0, minibatch 20 (the furthest"), message
    assert "raise rendezvous_timeout_s" in message
    assert "attempt 2" not in message and runner.runs == 2
    assert not _worker_children()


def test_every_worker_hanging_at_once_is_found_by_the_progress_watchdog(tmp_path, leftovers) -> None:
    """Both ranks sleep in forward at step 26: heartbeats go on and nobody waits in a collective, so only the
    progress watchdog (stall_timeout_s) sees it; two stalls at one step end the fit. Without the watchdog the fit
    would wait limit_s in each of the 25 steps left (then pytest's timeout fails the test)."""
    data = datasets.synthetic_classification(400, 12, 3, seed=1)  # 50 steps per worker: progress at 10, 20, ...
    hang = HangingMLP(12, 8, 3, marker=str(tmp_path / "never"), after=25, limit_s=60)
    net = Network(hang, updater=optim.SGD(lr=0.1), seed=0)
    master = ParameterAveragingTrainingMaster(averaging_frequency=1, rendezvous_timeout_s=60, stall_timeout_s=4)
    wrapper = ParallelWrapper(net, num_workers=2, master=master, progress=False)
    with pytest.raises(WorkerError) as info:
        wrapper.fit(data, epochs=1, batch_size=4)
    assert not isinstance(info.value, WorkerLost)
    message = str(info.value)
    assert message.startswith("attempts 0 and 1 both stopped at epoch 0, minibatch 20 (the furthest"), message
    assert "raise stall_timeout_s" in message and "attempt 2" not in message
    assert "[worker 0: epoch 0, minibatch 20; worker 1: epoch 0, minibatch 20]" in message
    assert "attempt 1: every worker stuck (no progress)" in message
    assert not _worker_children()
