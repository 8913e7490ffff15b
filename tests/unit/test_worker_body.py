"""The one worker body (``worker_main``): set-up, thread settings, error reporting and closing, with real torch."""

from __future__ import annotations

import pytest
import torch

from helpers import uniform_batches
from torchspark import Network, models, optim
from torchspark.nn import NetworkBlueprint
from torchspark.training import ItemSource, WorkerTask, run_worker
from torchspark.training.comm import SoloCommunicator
from torchspark.training.hooks import WorkerHooks
from torchspark.training.worker.body import RankSetup, WorkerEnv, train, worker_main


class _Comm(SoloCommunicator):
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def _recording_hooks(log: list[str]):
    def make(rank: int) -> WorkerHooks:
        return WorkerHooks(report_error=lambda trace: log.append(f"error:{trace}"), close=lambda: log.append("close"))

    return make


def _task(net: Network) -> WorkerTask:
    settings = {"averaging_frequency": 2, "save_updater": True}
    return WorkerTask("averaging", settings, NetworkBlueprint.of(net).to_bytes(), epochs=1, prefetch=0)


def test_training_through_the_body_equals_run_worker_and_reports_placement() -> None:
    net = Network(models.mlp(64, 8, 10), updater=optim.SGD(lr=0.1), seed=0)
    batches = uniform_batches(3, size=4, seed=1)
    direct = run_worker(_task(net), ItemSource(batches), SoloCommunicator())
    env = WorkerEnv(0, placement=(("7",), "host:/dir"), rendezvous=lambda device: (SoloCommunicator(), {"a": 1}))
    result = worker_main(env, train(_task(net), ItemSource(batches)))
    assert result is not None and result.params is not None and direct.params is not None
    assert torch.equal(result.params, direct.params)
    assert (result.device, result.gpu_addresses, result.executor, result.network) == (
        "cpu",
        ("7",),
        "host:/dir",
        {"a": 1},
    )


def test_threads_are_set_while_the_work_runs_and_restored_after() -> None:
    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    seen = worker_main(WorkerEnv(0, threads=wanted), lambda rank: torch.get_num_threads())
    assert seen == wanted
    assert torch.get_num_threads() == before


def test_a_failure_goes_over_the_channel_and_propagates_and_everything_is_closed() -> None:
    log: list[str] = []
    comm = _Comm()

    def boom(rank: RankSetup) -> None:
        raise RuntimeError("the work broke")

    env = WorkerEnv(3, rendezvous=lambda device: (comm, None), hooks=_recording_hooks(log))
    with pytest.raises(RuntimeError, match="the work broke"):
        worker_main(env, boom)
    assert log[0].startswith("error:") and "the work broke" in log[0]
    assert log[1:] == ["close"] and comm.closed == 1


def test_an_on_error_runner_gets_the_traceback_and_the_body_returns_none() -> None:
    errors: list[tuple[int, str]] = []
    log: list[str] = []

    def no_peers(device: str):
        raise TimeoutError("no peer came")

    env = WorkerEnv(2, rendezvous=no_peers, hooks=_recording_hooks(log), on_error=lambda r, t: errors.append((r, t)))
    assert worker_main(env, lambda rank: "never") is None
    assert errors[0][0] == 2 and "no peer came" in errors[0][1]
    assert log == ["close"]  # the channel is not used when the runner collects errors itself
