"""Elastic recovery with real worker processes (ParallelWrapper): a worker slot whose process keeps dying
(SIGKILL from outside, every time) shrinks the world to the workers that survive, down to ``min_workers``, and the
fit completes from the newest checkpoint; the world grows back to ``num_workers`` at the next epoch boundary (once
only when the slot still dies), or at a later failure with ``regrow="attempt"``."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from functools import partial

import pytest

from helpers import lenet_net
from torchspark import datasets, optim
from torchspark.errors import WorkerLost
from torchspark.parallel import ParallelWrapper
from torchspark.training.config.masters import ParameterAveragingTrainingMaster
from torchspark.training.config.shared_master import SharedTrainingMaster

_lenet = partial(lenet_net, updater=optim.Adam(lr=1e-3))
EPOCHS = 3
MASTERS = {
    "averaging": ParameterAveragingTrainingMaster(
        averaging_frequency=5, rng_seed=0, collect_training_stats=True, rendezvous_timeout_s=20
    ),
    "sharing": SharedTrainingMaster(rng_seed=0, collect_training_stats=True, rendezvous_timeout_s=20),
}


class KeepsDying:
    """A progress listener that SIGKILLs every rank-1 process reporting from epoch 1 on, ``rank1`` of them at most
    (a worker slot that keeps dying: a bad device, a host the OOM killer visits); with ``rank0_at`` it then kills the
    first rank-0 process that reports from that epoch on and was not seen before (a one-off fault in the smaller
    world, after which capacity is back)."""

    def __init__(self, rank1: int = 1000, rank0_at: int | None = None) -> None:
        self.rank1, self.rank0_at = rank1, rank0_at
        self.hit: list[tuple[int, int]] = []  # (rank, pid)
        self.all_pids: set[int] = set()
        self._old_rank0: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, update) -> None:
        with self._lock:
            if update.pid is None or update.pid in {pid for _, pid in self.hit}:
                return
            self.all_pids.add(update.pid)
            rank1_hits = sum(rank == 1 for rank, _ in self.hit)
            if update.rank == 1 and update.epoch >= 1 and rank1_hits < self.rank1:
                self._kill(1, update.pid)
            elif update.rank == 0 and rank1_hits < self.rank1:
                self._old_rank0.add(update.pid)
            elif (
                update.rank == 0
                and self.rank0_at is not None
                and update.epoch >= self.rank0_at
                and update.pid not in self._old_rank0
                and all(rank == 1 for rank, _ in self.hit)
            ):
                self._kill(0, update.pid)

    def _kill(self, rank: int, pid: int) -> None:
        self.hit.append((rank, pid))
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def undisturbed() -> dict[str, float]:
    """Test accuracy of the same fits without a fault, per master."""
    train, test = datasets.digits("train"), datasets.digits("test")
    found = {}
    for name, master in MASTERS.items():
        net = _lenet()
        ParallelWrapper(net, num_workers=2, master=master, progress=False).fit(train, epochs=EPOCHS, batch_size=16)
        found[name] = net.evaluate(test).accuracy()
    return found


@pytest.mark.parametrize("name", sorted(MASTERS))
def test_a_worker_that_keeps_dying_shrinks_the_world_and_the_fit_completes(
    name, tmp_path, leftovers, undisturbed
) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    master = dataclasses.replace(MASTERS[name], checkpoint_directory=str(tmp_path / "rigid"), max_failures=2)
    rigid = ParallelWrapper(_lenet(), num_workers=2, master=master, progress=False)
    rigid.add_progress_listener(KeepsDying())
    with pytest.raises(WorkerLost, match="more than max_failures=2"):  # without min_workers the fit fails
        rigid.fit(train, epochs=EPOCHS, batch_size=16)

    net = _lenet()
    fault = KeepsDying()
    master = dataclasses.replace(master, checkpoint_directory=str(tmp_path / "elastic"), min_workers=1)
    wrapper = ParallelWrapper(net, num_workers=2, master=master, progress=False)
    wrapper.add_progress_listener(fault)
    wrapper.fit(train, epochs=EPOCHS, batch_size=16)
    leftovers.assert_clean(gone=fault.all_pids)

    # killed in attempts 0 and 1; attempt 2 has no rank 1 and ends at the boundary of epoch 2, where the world grows
    # back (attempt 3); its rank 1 dies again: the growth did not hold, is not counted, and is not tried again
    assert [rank for rank, _ in fault.hit] == [1, 1, 1]
    summary = wrapper.training_stats.summary()
    changes = [(c["attempt"], c["epoch"], c["old"], c["new"]) for c in summary["world_changes"]]
    assert changes == [(2, 1, 2, 1), (3, 2, 1, 2), (4, 2, 2, 1)], summary["world_changes"]
    assert summary["world_changes"][2]["reason"] == "capacity did not hold: worker 1 lost after growing back"
    assert len(summary["failures"]) == 3 and len(wrapper.last_results) == 1
    assert summary["recovered_from"]["epoch"] == 2  # from the checkpoint of epoch 2, not the fit's start
    assert net.epoch == EPOCHS and summary["examples"] == EPOCHS * 1437
    accuracy = net.evaluate(test).accuracy()
    # at most 1 pp worse; it may be better: one worker takes twice the optimizer steps per epoch (sharing measured
    # 0.947 against 0.869 undisturbed: LeNet is not converged after 3 epochs)
    assert accuracy >= undisturbed[name] - 0.01, (accuracy, undisturbed[name])


@pytest.mark.parametrize("name", sorted(MASTERS))
def test_the_world_grows_back_at_the_epoch_boundary_when_the_slot_stops_dying(
    name, tmp_path, leftovers, undisturbed
) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = _lenet()
    fault = KeepsDying(rank1=2)  # rank 1 dies in attempts 0 and 1 only: then its slot works again
    master = dataclasses.replace(MASTERS[name], checkpoint_directory=str(tmp_path), min_workers=1)
    wrapper = ParallelWrapper(net, num_workers=2, master=master, progress=False)
    wrapper.add_progress_listener(fault)
    wrapper.fit(train, epochs=EPOCHS, batch_size=16)
    leftovers.assert_clean(gone=fault.all_pids)

    summary = wrapper.training_stats.summary()
    changes = [(c["attempt"], c["epoch"], c["old"], c["new"], c["reason"]) for c in summary["world_changes"]]
    assert changes == [
        (2, 1, 2, 1, "worker 1 was lost in two attempts in a row"),
        (3, 2, 1, 2, "capacity returned"),  # attempt 2 ended at the boundary of epoch 2 without a failure
    ]
    assert len(summary["failures"]) == 2 and len(wrapper.last_results) == 2  # the fit ends with both workers
    assert net.epoch == EPOCHS and summary["examples"] == EPOCHS * 1437
    accuracy = net.evaluate(test).accuracy()
    # averaging: at most 1 pp worse. Sharing: the recovery tests' 2 pp band (measured 0.858 against 0.869, as in
    # test_a_later_attempt_grows_the_world_back: epochs of one and two workers mixed, LeNet not converged after 3
    # epochs; the growth itself equals a new fit on more workers exactly, tests/unit/test_elastic.py)
    band = 0.01 if name == "averaging" else 0.02
    assert accuracy >= undisturbed[name] - band, (accuracy, undisturbed[name])


def test_a_later_attempt_grows_the_world_back(tmp_path, leftovers, undisturbed) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = _lenet()
    fault = KeepsDying(rank1=2, rank0_at=2)  # rank 1 dies twice (shrink to 1), then the lone rank 0 once
    master = dataclasses.replace(
        MASTERS["sharing"], checkpoint_directory=str(tmp_path), min_workers=1, regrow="attempt"
    )
    wrapper = ParallelWrapper(net, num_workers=2, master=master, progress=False)
    wrapper.add_progress_listener(fault)
    wrapper.fit(train, epochs=EPOCHS, batch_size=16)
    leftovers.assert_clean(gone=fault.all_pids)

    assert [rank for rank, _ in fault.hit] == [1, 1, 0]
    summary = wrapper.training_stats.summary()
    changes = [(c["attempt"], c["epoch"], c["old"], c["new"], c["reason"]) for c in summary["world_changes"]]
    assert changes == [
        (2, 1, 2, 1, "worker 1 was lost in two attempts in a row"),
        (3, 2, 1, 2, "capacity returned"),
    ]
    assert len(wrapper.last_results) == 2  # the last attempt ran both workers again
    assert net.epoch == EPOCHS and summary["examples"] == EPOCHS * 1437
    accuracy = net.evaluate(test).accuracy()
    # the recovery tests' noise band (2 pp; measured 0.858 against 0.869: epochs of one and of two workers mixed)
    assert abs(accuracy - undisturbed["sharing"]) <= 0.02, (accuracy, undisturbed["sharing"])
