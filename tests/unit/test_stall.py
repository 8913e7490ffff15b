"""The progress watchdog (``stall_timeout_s``): a fit whose workers all hang at once fails as a hang naming each
rank's step; the first report of an attempt gets twice the time; two such hangs at one step are not retried; and an
injected ``LocalProcessRunner`` takes the master's ``rendezvous_timeout_s`` (no processes here: see
tests/multiprocess/test_recovery_parallel.py for the fits)."""

from __future__ import annotations

import math

import pytest

from torchspark import Network, datasets, models, optim
from torchspark.errors import ConfigError, WorkerError, WorkerLost
from torchspark.parallel import LocalProcessRunner, ParallelWrapper
from torchspark.training.config.masters import ParameterAveragingTrainingMaster, master_from_json
from torchspark.training.config.shared_master import SharedTrainingMaster
from torchspark.training.driver.recovery import FailureRecord, hang_error, record_failure, repeated_hang
from torchspark.training.driver.stall import FIRST_REPORT_FACTOR, NO_PROGRESS, SILENT_S, ProgressStall
from torchspark.training.hooks import ProgressUpdate
from torchspark.training.progress.liveness import Liveness


class _Fit:
    """One attempt's progress channel as the driver sees it, on a fake clock."""

    def __init__(self, timeout_s: float | None, world: int = 2) -> None:
        self.now = 0.0
        self.world = world
        self.live = Liveness(clock=lambda: self.now)
        self.latest: dict[int, ProgressUpdate] = {}
        self.stall = ProgressStall(timeout_s, clock=lambda: self.now)

    def connect(self, *ranks: int) -> None:
        for rank in ranks:
            self.live.seen(rank, pid=100 + rank)

    def report(self, rank: int, epoch: int, iteration: int) -> None:
        self.latest[rank] = ProgressUpdate(rank, epoch, iteration, examples=iteration * 4, score=1.0)
        self.live.seen(rank)

    def at(self, t: float, stopped: tuple[int, ...] = ()) -> WorkerLost | None:
        """The verdict at ``t``; every connected rank not ended sent a heartbeat just before, except ``stopped``."""
        self.now = t
        for rank, state in self.live.snapshot().items():
            if not state.ended and rank not in stopped:
                self.live.seen(rank)
        return self.stall.check(self.world, self.latest, self.live.snapshot())


def test_no_new_step_for_stall_timeout_s_fails_the_attempt_naming_each_ranks_step() -> None:
    fit = _Fit(timeout_s=10.0)
    fit.connect(0, 1)
    fit.report(0, 0, 10)
    fit.report(1, 0, 10)
    assert fit.at(1.0) is None  # the clock starts here
    fit.report(1, 0, 20)  # one rank's report is progress of the fit
    assert fit.at(9.0) is None
    fit.report(0, 0, 20)
    assert fit.at(10.0) is None
    assert fit.at(20.0) is None  # exactly the limit: still fine
    lost = fit.at(20.5)
    assert isinstance(lost, WorkerLost) and lost.exit_status == NO_PROGRESS and lost.rank is None
    message = str(lost)
    assert message.startswith("no worker reported a new step for 10 s since the last progress report "), message
    assert "(stall_timeout_s=10)" in message
    assert "[worker 0: epoch 0, minibatch 20; worker 1: epoch 0, minibatch 20]" in message
    assert "raise stall_timeout_s on the training master" in message


def test_the_first_report_gets_twice_the_time_counted_from_when_every_rank_connected() -> None:
    fit = _Fit(timeout_s=10.0)
    fit.connect(0)
    assert fit.at(100.0) is None  # rank 1 still starting (its imports, a slow host): not counted
    fit.connect(1)
    assert fit.at(101.0) is None  # every rank connected: the clock starts
    assert fit.at(101.0 + FIRST_REPORT_FACTOR * 10.0) is None  # rendezvous, first data, compile: allowed
    lost = fit.at(101.5 + FIRST_REPORT_FACTOR * 10.0)
    assert lost is not None and "none has reported progress yet" in str(lost)
    assert "worker 0: before its first progress report" in str(lost)


def test_stall_timeout_none_never_fails_and_finished_workers_are_not_stalled() -> None:
    off = _Fit(timeout_s=None)
    off.connect(0, 1)
    assert off.at(0.0) is None and off.at(1e9) is None

    fit = _Fit(timeout_s=5.0)
    fit.connect(0, 1)
    fit.report(0, 0, 10)
    fit.report(1, 0, 10)
    assert fit.at(0.0) is None
    fit.live.ended(0)  # rank 0 finished its share; rank 1 hangs
    assert "worker 0: finished; worker 1: epoch 0, minibatch 10" in str(fit.at(6.0))
    fit.live.ended(1)  # every rank ended: the heartbeat watchdog's rule 2 decides, not this one
    assert fit.at(60.0) is None


def test_one_stopped_worker_among_live_ones_is_named_by_rank_not_every_worker_stuck() -> None:
    """A SIGSTOPped worker: its peers wait for it in a collective (no new step anywhere), but only its heartbeats
    stop. The verdict names its rank (waiting while its heartbeat is merely late); every worker stuck only when
    every live worker still beats, every worker stopped only when none does."""
    fit = _Fit(timeout_s=3.0, world=3)
    fit.connect(0, 1, 2)
    for rank in range(3):
        fit.report(rank, 0, 10)
    assert fit.at(1.0) is None  # the clock starts; worker 1 is stopped from here on
    assert fit.at(4.5, stopped=(1,)) is None  # past stall_timeout_s, but worker 1's heartbeat is only late
    lost = fit.at(1.0 + SILENT_S + 0.5, stopped=(1,))
    assert isinstance(lost, WorkerLost) and lost.rank == 1 and lost.exit_status == "no heartbeat", lost
    assert "worker 1 (pid 101) sent no heartbeat for 10 s while the others' go on" in str(lost)
    assert "every worker" not in str(lost)
    record = record_failure(lost, 0, 0.0, (0, 10), {0: 100, 1: 101, 2: 102})
    assert (record.rank, record.pid) == (1, 101)

    every = _Fit(timeout_s=3.0, world=2)
    every.connect(0, 1)
    assert every.at(1.0) is None
    lost = every.at(1.0 + SILENT_S + 0.5, stopped=(0, 1))
    assert lost is not None and lost.rank is None and "every worker process stopped responding" in str(lost)

    stuck = _Fit(timeout_s=3.0, world=2)
    stuck.connect(0, 1)
    assert stuck.at(1.0) is None
    lost = stuck.at(7.5)  # both beat (and no first report within 2 x 3 s): every worker is stuck
    assert lost is not None and lost.rank is None and lost.exit_status == NO_PROGRESS
    assert "every worker is stuck" in str(lost)


def _stalled(attempt: int, point: tuple[int, int] | None) -> FailureRecord:
    epoch, iteration = point if point is not None else (None, None)
    return FailureRecord(attempt, None, None, NO_PROGRESS, "no worker progressed for 4 s", 0.0, 0.0, epoch, iteration)


def test_two_stalls_at_one_step_end_the_fit_and_name_the_knob() -> None:
    stalls = [_stalled(0, (0, 20)), _stalled(1, (0, 20))]
    assert repeated_hang(stalls)
    error = hang_error(stalls, WorkerLost("stuck"))
    assert not isinstance(error, WorkerLost)
    assert str(error).startswith("attempts 0 and 1 both stopped at epoch 0, minibatch 20 (the furthest"), str(error)
    assert "raise stall_timeout_s" in str(error)
    assert "attempt 1: every worker stuck (no progress): no worker progressed for 4 s" in str(error)
    assert not repeated_hang([_stalled(0, (0, 10)), _stalled(1, (0, 20))])  # moved on: retried
    # both before any report (every rank had connected): the same place, so not retried a third time
    early = [_stalled(0, None), _stalled(1, None)]
    assert repeated_hang(early)
    assert "both stopped before any worker's first progress report" in str(hang_error(early, WorkerLost("x")))


def test_a_stall_blames_no_rank() -> None:
    lost = WorkerLost("stuck", exit_status=NO_PROGRESS, reason="no worker progressed for 4 s")
    record = record_failure(lost, 0, 0.0, (0, 20), {0: 10, 1: 11}, suspect=1)
    assert (record.rank, record.pid, record.exit_status) == (None, None, NO_PROGRESS)


@pytest.mark.parametrize("cls", [ParameterAveragingTrainingMaster, SharedTrainingMaster])
@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "60", 1e9])
def test_stall_timeout_s_is_validated(cls, bad) -> None:
    with pytest.raises(ConfigError, match=rf"{cls.__name__}: stall_timeout_s must be a finite number of seconds"):
        cls(stall_timeout_s=bad)


@pytest.mark.parametrize("value", [None, 2.5])
def test_stall_timeout_s_round_trips(value) -> None:
    master = SharedTrainingMaster(stall_timeout_s=value)
    assert master_from_json(master.to_json()).stall_timeout_s == value
    assert ParameterAveragingTrainingMaster().stall_timeout_s == 1800.0


def _net() -> Network:
    return Network(models.mlp(4, 8, 3), updater=optim.SGD(lr=0.1), seed=0)


def test_an_injected_runner_takes_the_masters_rendezvous_timeout() -> None:
    runner = LocalProcessRunner(["cpu", "cpu"])
    assert runner.effective_timeout_s == 300.0  # on its own: the masters' default
    ParallelWrapper(_net(), master=ParameterAveragingTrainingMaster(rendezvous_timeout_s=3), runner=runner)
    assert runner.effective_timeout_s == 3  # not its own 300 s: a hung worker is found after 3 s
    ParallelWrapper(_net(), master=ParameterAveragingTrainingMaster(rendezvous_timeout_s=3), runner=runner)
    own = LocalProcessRunner(["cpu", "cpu"], timeout_s=3)  # set on both, equal: fine
    ParallelWrapper(_net(), master=ParameterAveragingTrainingMaster(rendezvous_timeout_s=3), runner=own)
    assert own.effective_timeout_s == 3


def test_a_runner_timeout_other_than_the_masters_is_refused_naming_both() -> None:
    own = LocalProcessRunner(["cpu", "cpu"], timeout_s=60)
    with pytest.raises(
        ConfigError,
        match=r"LocalProcessRunner\(timeout_s=60\) and the training master's "
        r"rendezvous_timeout_s=3 disagree",
    ):
        ParallelWrapper(_net(), master=ParameterAveragingTrainingMaster(rendezvous_timeout_s=3), runner=own)
    wrapper = ParallelWrapper(_net(), num_workers=2, runner=LocalProcessRunner(["cpu", "cpu"], timeout_s=300))
    wrapper.rendezvous_timeout_s = 5  # changed after construction: refused at fit, before any process starts
    with pytest.raises(ConfigError, match=r"timeout_s=300\) and the training master's rendezvous_timeout_s=5"):
        wrapper.fit(datasets.synthetic_classification(8, 4, 3), batch_size=2)
    for bad in (0, math.inf, True):
        with pytest.raises(ConfigError, match="LocalProcessRunner: timeout_s must be a finite number of seconds"):
            LocalProcessRunner(["cpu"], timeout_s=bad)


def test_a_hang_error_is_a_worker_error() -> None:
    assert issubclass(type(hang_error([_stalled(0, None), _stalled(1, None)], WorkerLost("x"))), WorkerError)


def test_an_injected_runner_takes_the_masters_shared_memory_allreduce() -> None:
    runner = LocalProcessRunner(["cpu", "cpu"])
    assert runner.effective_shared_memory is True  # on its own: the masters' default
    master = ParameterAveragingTrainingMaster(shared_memory_allreduce=False)
    ParallelWrapper(_net(), master=master, runner=runner)
    assert runner.effective_shared_memory is False  # the master's switch reaches the workers (run() passes this)
    own = LocalProcessRunner(["cpu", "cpu"], shared_memory=True)
    with pytest.raises(
        ConfigError,
        match=r"LocalProcessRunner\(shared_memory=True\) and the training master's "
        r"shared_memory_allreduce=False disagree",
    ):
        ParallelWrapper(_net(), master=master, runner=own)
    with pytest.raises(ConfigError, match=r"shared_memory must be True or False.*got 'yes'"):
        LocalProcessRunner(["cpu"], shared_memory="yes")


def test_an_injected_runner_takes_the_wrappers_threads_per_worker_and_refuses_another() -> None:
    runner = LocalProcessRunner(["cpu", "cpu"])
    assert runner.effective_threads == 1  # on its own
    ParallelWrapper(_net(), num_workers=2, runner=runner, threads_per_worker=3)
    assert runner.effective_threads == 3  # the wrapper's (run() gives the workers this count)
    own = LocalProcessRunner(["cpu", "cpu"], threads_per_worker=2)
    ParallelWrapper(_net(), num_workers=2, runner=own)  # only the runner sets it: its own
    assert own.effective_threads == 2
    with pytest.raises(
        ConfigError,
        match=r"LocalProcessRunner\(threads_per_worker=2\) and ParallelWrapper's threads_per_worker=3 disagree, "
        r"and both set the same thing; set threads_per_worker on ParallelWrapper",
    ):
        ParallelWrapper(_net(), num_workers=2, runner=own, threads_per_worker=3)
    with pytest.raises(ConfigError, match="threads_per_worker must be an integer >= 1 or None, got 0"):
        LocalProcessRunner(["cpu"], threads_per_worker=0)


def test_the_rounds_route_watch_fails_a_round_past_stall_timeout_and_allows_twice_for_the_first() -> None:
    from torchspark.training.driver.stall import round_watch

    now = [100.0]
    assert round_watch(None, False, "epoch 1, round 1/4", clock=lambda: now[0]) is None  # watchdog off
    later = round_watch(10.0, False, "epoch 1, round 3/4", clock=lambda: now[0])
    first = round_watch(10.0, True, "epoch 1, round 1/4", clock=lambda: now[0])
    now[0] += 10.0
    assert later() is None and first() is None  # not past its limit yet
    now[0] += 0.5
    lost = later()
    assert isinstance(lost, WorkerLost) and lost.exit_status == "no progress"
    assert "the averaging round epoch 1, round 3/4 has run for 10 s, longer than stall_timeout_s=10:" in str(lost)
    assert first() is None  # the attempt's first round gets twice the limit
    now[0] += 10.0
    assert "(2 x for an attempt's first round)" in str(first())
