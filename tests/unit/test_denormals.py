"""flush_denormal reaches the workers' threads and leaves the calling thread as it was."""

from __future__ import annotations

import pytest
import torch

from denormal_case import DENORMAL, denormal_net, watched, zero_feature_data
from torchspark.nn import NetworkBlueprint
from torchspark.training import InProcessRunner, ItemSource, WorkerTask
from torchspark.training.worker import merge_results


def _fit(flush: bool, workers: int) -> float:
    net = denormal_net()
    task = WorkerTask("averaging", {"averaging_frequency": 2, "save_updater": True},
                      NetworkBlueprint.of(net).to_bytes(), epochs=1, prefetch=0, flush_denormal=flush)
    shards = [ItemSource(zero_feature_data(32, seed=r).split(8)) for r in range(workers)]
    merge_results(net, InProcessRunner(timeout_s=30).run(task, shards))
    return watched(net)


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_flush_denormals_by_default_and_keep_them_when_told(workers: int) -> None:
    assert _fit(flush=True, workers=workers) == 0.0
    kept = _fit(flush=False, workers=workers)
    assert 0 < kept < 1e-37 and kept == pytest.approx(DENORMAL, rel=1e-3)


def test_the_calling_thread_keeps_ieee_denormals_after_a_worker_ran_in_it() -> None:
    _fit(flush=True, workers=1)  # a single worker runs in the calling thread
    assert float(torch.tensor([DENORMAL]) * 1.0) > 0, "flush-to-zero leaked into the caller's thread"


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
