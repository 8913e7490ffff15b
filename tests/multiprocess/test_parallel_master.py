"""ParallelWrapper takes the training master SparkNetwork takes; its keyword options build that master."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from helpers import mlp_net
from torchspark import DataSet, datasets, optim
from torchspark.encoding import FixedThreshold
from torchspark.errors import ConfigError, DataError, WorkerError
from torchspark.parallel import ParallelWrapper
from torchspark.training import InProcessRunner, ParameterAveragingTrainingMaster, SharedTrainingMaster

DATA = datasets.synthetic_classification(96, 12, 3, seed=4)


_net = partial(mlp_net, 12, 16, 3, updater=optim.Adam(lr=1e-2))


@pytest.mark.parametrize("mode", ["averaging", "sharing"])
def test_a_master_trains_like_the_options_that_build_it(mode: str) -> None:
    if mode == "averaging":
        master = ParameterAveragingTrainingMaster(batch_size_per_worker=8, averaging_frequency=3, rng_seed=2)
        options = {"training_mode": mode, "averaging_frequency": 3, "rng_seed": 2}
    else:
        master = SharedTrainingMaster(batch_size_per_worker=8, threshold_algorithm=FixedThreshold(1e-3), rng_seed=2)
        options = {"training_mode": mode, "threshold_algorithm": FixedThreshold(1e-3), "rng_seed": 2}
    with_master, with_options = _net(), _net()
    a = ParallelWrapper(with_master, num_workers=2, master=master, progress=False, runner=InProcessRunner(timeout_s=60))
    a.fit(DATA, epochs=2)  # batch_size: the master's batch_size_per_worker
    b = ParallelWrapper(with_options, num_workers=2, progress=False, runner=InProcessRunner(timeout_s=60), **options)
    assert type(b.master) is type(master)
    b.fit(DATA, epochs=2, batch_size=8)
    torch.testing.assert_close(with_master.params(), with_options.params(), atol=0, rtol=0)
    assert with_master.iteration == with_options.iteration == 12  # 48 examples per worker and epoch, 8 a batch
    assert [r.examples for r in a.last_results] == [96, 96]


def test_the_in_process_runner_gives_the_worker_processes_result() -> None:
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=8, averaging_frequency=2)
    in_threads, in_processes = _net(), _net()
    ParallelWrapper(in_threads, num_workers=2, master=master, progress=False, runner=InProcessRunner(timeout_s=60)).fit(
        DATA, epochs=2
    )
    ParallelWrapper(in_processes, num_workers=2, master=master, progress=False, threads_per_worker=1).fit(
        DATA, epochs=2
    )
    torch.testing.assert_close(in_threads.params(), in_processes.params(), atol=1e-6, rtol=1e-5)
    assert in_threads.iteration == in_processes.iteration


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"master": "averaging"}, "master must be a ParameterAveragingTrainingMaster or SharedTrainingMaster"),
        (
            {"master": ParameterAveragingTrainingMaster(), "averaging_frequency": 3},
            r"pass either master= or the options that build one, not both: \['averaging_frequency'\]",
        ),
        ({"master": SharedTrainingMaster(), "training_mode": "sharing"}, r"not both: \['training_mode'\]"),
        ({"master": ParameterAveragingTrainingMaster(averaging_via="spark")}, "averaging_via='spark' would be ignored"),
        (
            {"master": SharedTrainingMaster(export_directory="/tmp/x", port=5000)},
            "export_directory='/tmp/x', port=5000 would be ignored",
        ),
        (
            {"master": ParameterAveragingTrainingMaster(num_workers=3), "num_workers": 2},
            "num_workers=2 but the master's num_workers=3",
        ),
        ({"save_updater": "yes"}, r"save_updater must be True or False, got 'yes'"),
        ({"runner": object()}, "runner must have a run"),
    ],
)
def test_conflicting_or_ignored_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ParallelWrapper(_net(), progress=False, **kwargs)


def test_the_masters_worker_count_is_used() -> None:
    wrapper = ParallelWrapper(
        _net(), master=ParameterAveragingTrainingMaster(num_workers=3), devices=["cpu"], progress=False
    )
    assert wrapper.worker_devices == ["cpu", "cpu", "cpu"]


@pytest.mark.parametrize("in_process", [True, False])
def test_a_data_error_a_worker_meets_stays_a_data_error(in_process: bool) -> None:
    labels = DATA.labels.clone()
    labels[60:70] = 9  # past the first minibatch, which the driver checks
    runner = InProcessRunner(timeout_s=60) if in_process else None
    wrapper = ParallelWrapper(_net(), num_workers=2, progress=False, runner=runner, threads_per_worker=1)
    with pytest.raises(DataError, match="label index 9") as info:
        wrapper.fit(DataSet(DATA.features, labels), batch_size=8)
    assert isinstance(info.value, WorkerError) and "--- worker traceback ---" in str(info.value)


def test_an_injected_local_process_runner_trains_with_the_wrappers_thread_count() -> None:
    from torchspark.parallel import LocalProcessRunner

    runner = LocalProcessRunner(["cpu", "cpu"])  # its own threads_per_worker left None
    wrapper = ParallelWrapper(_net(), num_workers=2, progress=False, runner=runner, threads_per_worker=2)
    wrapper.fit(DATA, batch_size=8)
    assert [r.threads for r in wrapper.last_results] == [2, 2]  # the runner's own default would be 1
