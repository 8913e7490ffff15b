"""flush_denormal reaches the workers' threads and leaves the calling thread as it was."""

from __future__ import annotations

import pytest
import torch

from denormal_case import DENORMAL, denormal_net, watched, zero_feature_data
from helpers import fit_in_process
from torchspark.nn import NetworkBlueprint
from torchspark.training import ItemSource, WorkerTask


def _fit(flush: bool, workers: int) -> float:
    net = denormal_net()
    shards = [zero_feature_data(32, seed=r).split(8) for r in range(workers)]
    fit_in_process(net, "averaging", {"averaging_frequency": 2, "save_updater": True}, shards, flush_denormal=flush)
    return watched(net)


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_flush_denormals_by_default_and_keep_them_when_told(workers: int) -> None:
    assert _fit(flush=True, workers=workers) == 0.0
    kept = _fit(flush=False, workers=workers)
    assert 0 < kept < 1e-37 and kept == pytest.approx(DENORMAL, rel=1e-3)


def test_the_calling_thread_keeps_ieee_denormals_after_a_worker_ran_in_it() -> None:
    _fit(flush=True, workers=1)  # a single worker runs in the calling thread
    assert float(torch.tensor([DENORMAL]) * 1.0) > 0, "flush-to-zero leaked into the caller's thread"


def test_a_worker_puts_back_the_thread_count_and_flush_mode_it_found() -> None:
    """As a reused Spark Python worker needs (its task runs ``run_worker`` in the process's main thread): a thread
    that flushed denormals itself keeps flushing (not switched off), and torch's thread count goes back to what it
    was after a task that set its own."""
    from torchspark.training.comm import SoloCommunicator
    from torchspark.training.worker.loop import run_worker

    net = denormal_net()
    task = WorkerTask(
        "averaging",
        {"averaging_frequency": 2, "save_updater": True},
        NetworkBlueprint.of(net).to_bytes(),
        epochs=1,
        prefetch=0,
        flush_denormal=True,
        num_threads=1,
    )
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        torch.set_flush_denormal(True)
        result = run_worker(task, ItemSource(zero_feature_data(32).split(8)), SoloCommunicator())  # in this thread
        assert result.threads == 1  # the task trained with its own count
        assert float(torch.tensor([DENORMAL]) * 1.0) == 0.0, "this thread's own flush mode was switched off"
        assert torch.get_num_threads() == 2
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def test_task_thread_settings_restore_even_when_the_task_fails() -> None:
    from torchspark.training.worker.devices import denormals_flushed, task_thread_settings

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(RuntimeError, match="boom"):
            with task_thread_settings(1, True):
                assert torch.get_num_threads() == 1 and denormals_flushed()
                raise RuntimeError("boom")
        assert torch.get_num_threads() == 2 and not denormals_flushed()
        with task_thread_settings(None, False):  # nothing asked, nothing touched
            assert torch.get_num_threads() == 2 and not denormals_flushed()
    finally:
        torch.set_num_threads(threads)


def test_masters_and_wrapper_validate_the_flag() -> None:
    from torchspark.errors import ConfigError
    from torchspark.parallel import ParallelWrapper
    from torchspark.spark import ParameterAveragingTrainingMaster

    with pytest.raises(ConfigError, match="flush_denormal must be True or False, got 'yes'"):
        ParameterAveragingTrainingMaster(flush_denormal="yes")
    with pytest.raises(ConfigError, match="flush_denormal must be True or False"):
        ParallelWrapper(denormal_net(), flush_denormal=1)
    master = ParameterAveragingTrainingMaster(flush_denormal=False)
    assert ParameterAveragingTrainingMaster.from_json(master.to_json()).flush_denormal is False
