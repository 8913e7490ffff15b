"""ParallelWrapper's construction, input checks and device plan: pure logic, no worker process starts."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch

from helpers import mlp_net
from torchspark import DataSet, datasets, optim
from torchspark.data import save_batches
from torchspark.encoding import FixedThreshold
from torchspark.errors import ConfigError, DataError
from torchspark.parallel import ParallelWrapper, plan_devices
from torchspark.parallel import devices as devices_module
from torchspark.parallel.bootstrap import backend_for_devices
from torchspark.parallel.routing import route_data
from torchspark.training.assignment import plan_files, split_examples
from torchspark.training.worker.loop import load_item

_net = partial(mlp_net, 4, 4, 2, updater=optim.SGD(lr=0.1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 0}, "num_workers must be an integer >= 1 or None, got 0"),
        ({"num_workers": True}, "num_workers must be an integer"),
        ({"workers": 2}, "does not take ['workers']"),  # one vocabulary: num_workers, as the masters say
        ({"average_updaters": False}, "does not take ['average_updaters']"),  # the master's save_updater
        ({"prefetch_buffer": 2}, "does not take ['prefetch_buffer']"),  # the master's worker_prefetch_num_batches
        ({"training_mode": "shared_gradients"}, "training_mode must be one of ['averaging', 'sharing']"),
        ({"training_mode": "sharing", "averaging_frequency": 2}, "they are options of training_mode='averaging'"),
        ({"export_directory": "/tmp/x"}, "only mean something on Spark"),
        ({"training_mode": "sync"}, "training_mode must be one of ['averaging', 'sharing'], got 'sync'"),
        ({"devices": ["gpu7"]}, "devices[0]='gpu7' is not a device"),
        ({"devices": ["cpu", "cuda:x"]}, "devices[1]='cuda:x'"),
        ({"devices": []}, "devices must be a non-empty list"),
        ({"devices": "cpu"}, "devices must be a non-empty list"),
        ({"averaging_frequency": 0}, "averaging_frequency must be an integer >= 1, got 0"),
        ({"worker_prefetch_num_batches": -1}, "worker_prefetch_num_batches must be an integer >= 0"),
        ({"rng_seed": -3}, "rng_seed must be an integer >= 0 or None, got -3"),
        ({"threads_per_worker": 0}, "threads_per_worker must be an integer >= 1 or None, got 0"),
        (
            {"rendezvous_timeout_s": 0},
            "rendezvous_timeout_s must be a finite number of seconds in (0, 604800.0], got 0",
        ),
        ({"training_mode": "sharing", "overlap": "yes"}, "overlap must be True or False, got 'yes'"),
        ({"progress": "yes"}, "progress must be True, False or None"),
        ({"training_mode": ["averaging"]}, "training_mode must be one of"),
        ({"training_mode": "sharing", "threshold_algorithm": 1e-3}, "threshold_algorithm must be a policy object"),
    ],
)
def test_bad_settings_are_refused_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ParallelWrapper(_net(), **kwargs)
    assert message in str(info.value)


def test_accessors_are_properties_not_java_style_methods() -> None:
    wrapper = ParallelWrapper(_net(), num_workers=2)
    assert math.isnan(wrapper.score)  # no fit yet
    wrapper.collect_training_stats = True  # rebuilds the master the options built
    assert wrapper.collect_training_stats and wrapper.master.collect_training_stats
    for old in ("get_score", "set_collect_training_stats", "training_master", "workers"):
        with pytest.raises(AttributeError, match=old):
            getattr(wrapper, old)


def test_network_must_be_a_torchspark_network() -> None:
    with pytest.raises(ConfigError, match="network must be a torchspark.Network, got Linear"):
        ParallelWrapper(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_policy_dicts_are_accepted() -> None:
    wrapper = ParallelWrapper(
        _net(), num_workers=2, training_mode="sharing", threshold_algorithm=FixedThreshold(1e-3).to_dict()
    )
    assert isinstance(wrapper.threshold_algorithm, FixedThreshold)


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (DataSet(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)), DataError, "empty DataSet (0 examples)"),
        ([], DataError, "the list or iterable is empty"),
        (iter([]), DataError, "the list or iterable is empty"),
        ("/data/batches", DataError, "'/data/batches' does not exist"),
        (42, DataError, "cannot train on a int"),
        (["a.safetensors", 3], DataError, "data[1] is a int"),
        ([datasets.synthetic_classification(8, 4, 2), "x.safetensors"], DataError, "data[1] is a str"),
        ([torch.zeros(3)], DataError, "data[0] is a Tensor"),
        (["/nonexistent/batch_000000.safetensors"], DataError, "batch file not found"),
    ],
)
def test_bad_data_is_refused_before_any_worker_starts(data, error, message: str) -> None:
    with pytest.raises(error) as info:
        ParallelWrapper(_net(), num_workers=2, progress=False).fit(data)
    assert message in str(info.value)


def test_bad_fit_arguments() -> None:
    wrapper = ParallelWrapper(_net(), num_workers=2, progress=False)
    data = datasets.synthetic_classification(8, 4, 2)
    with pytest.raises(ConfigError, match="epochs must be an integer >= 1, got 0"):
        wrapper.fit(data, epochs=0)
    with pytest.raises(ConfigError, match="batch_size must be an integer >= 1, got 0"):
        wrapper.fit(data, batch_size=0)
    with pytest.raises(ConfigError, match="trains one epoch only, got epochs=2"):
        wrapper.fit(iter(data.split(4)), epochs=2)
    bad = DataSet(torch.full((8, 4), float("nan")), torch.zeros(8, dtype=torch.long))
    with pytest.raises(DataError, match="NaN"):
        wrapper.fit(bad)


@pytest.mark.parametrize(
    ("num_workers", "devices", "gpus", "cores", "expected"),
    [
        (None, None, 0, 4, ["cpu"] * 4),  # no GPU: one worker per core
        (2, None, 0, 8, ["cpu", "cpu"]),
        (None, None, 2, 8, ["cuda:0", "cuda:1"]),  # one worker per GPU
        (3, None, 2, 8, ["cuda:0", "cuda:1", "cuda:0"]),  # round-robin
        (None, ["cuda:1"], 2, 8, ["cuda:1"]),
        (4, ["cuda:1", "cpu"], 2, 8, ["cuda:1", "cpu", "cuda:1", "cpu"]),
        (None, ["cuda"], 1, 8, ["cuda:0"]),
        (None, [torch.device("cpu"), "cpu"], 0, 8, ["cpu", "cpu"]),
    ],
)
def test_plan_devices(num_workers, devices, gpus: int, cores: int, expected: list[str]) -> None:
    assert plan_devices(num_workers=num_workers, devices=devices, gpu_count=gpus, cpu_count=cores) == expected


@pytest.mark.parametrize(
    ("devices", "gpus", "message"),
    [
        (["cuda:0"], 0, "devices[0]='cuda:0' but torch sees 0 CUDA GPU(s) here; use devices=['cpu']"),
        (["cuda:0", "cuda:2"], 2, "devices[1]='cuda:2' but torch sees 2 CUDA GPU(s) here; use cuda:0..cuda:1"),
        (["tpu"], 2, "devices[0]='tpu' is not a device"),
    ],
)
def test_plan_devices_refuses_missing_gpus(devices: list[str], gpus: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_devices(None, devices, gpus, 8)
    assert message in str(info.value)


@pytest.mark.parametrize("gpus", [0, 2])
def test_default_devices_follow_the_machine(monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    # pure-logic test: pretend about the GPU count; nothing touches a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(devices_module.os, "cpu_count", lambda: 3)
    expected = ["cuda:0", "cuda:1"] if gpus else ["cpu"] * 3
    assert devices_module.default_devices(None) == expected
    assert ParallelWrapper(_net()).worker_devices == expected
    assert ParallelWrapper(_net(), num_workers=3).worker_devices == (
        ["cuda:0", "cuda:1", "cuda:0"] if gpus else ["cpu"] * 3
    )


@pytest.mark.parametrize(
    ("devices", "backend"),
    [
        (["cpu", "cpu"], "gloo"),
        (["cuda:0", "cuda:1"], "nccl"),
        (["cuda:0", "cuda:0"], "gloo"),  # nccl refuses two ranks on one GPU
        (["cuda:0", "cpu"], "gloo"),
    ],
)
def test_backend_for_devices(devices: list[str], backend: str) -> None:
    assert backend_for_devices(devices) == backend


def _rows(batches) -> list[list[float]]:
    return [b.features[:, 0].tolist() for b in batches]


def test_a_dataset_is_split_with_sparks_plan() -> None:
    data = datasets.synthetic_classification(50, 4, 2, seed=3)
    plan = route_data(data, 2, 8, 1, rng_seed=5)
    expected = split_examples([data], 8, 2, 5)
    assert [_rows(f) for f in plan.shares.feeds] == [_rows(f) for f in expected]
    assert [sum(len(b) for b in f) for f in plan.shares.feeds] == [25, 25]  # equal examples, not only minibatches
    assert plan.shares.paths is None and plan.shares.stream is None


def test_a_list_of_odd_sized_datasets_is_cut_like_one_dataset() -> None:
    data = datasets.synthetic_classification(50, 4, 2, seed=3)
    pieces = data.split(7)  # SparkNetwork cuts what it gets on one grid over the whole data, in order
    plan = route_data(pieces, 2, 8, 1, rng_seed=None)
    assert [[len(b) for b in f] for f in plan.shares.feeds] == [[8, 8, 9], [7, 8, 8, 2]]  # no 1-example minibatch
    assert [_rows(f) for f in plan.shares.feeds] == [_rows(f) for f in split_examples([data], 8, 2, None)]


def test_a_list_mixing_dataset_kinds_is_refused() -> None:
    data = datasets.synthetic_classification(16, 4, 2, seed=3)
    with pytest.raises(DataError, match="mixes"):
        route_data([data, data.to_multi()], 2, 8, 1, rng_seed=None)


def test_paths_are_rebatched_with_sparks_plan(tmp_path) -> None:
    data = datasets.synthetic_classification(45, 4, 2, seed=3)
    paths = save_batches(
        [data.slice(0, 5), data.slice(5, 25), data.slice(25, 27), data.slice(27, 45)], str(tmp_path)
    )  # files of 5, 20, 2 and 18 examples
    kept = route_data([Path(p) for p in paths], 2, 8, 3, rng_seed=1)  # shuffle_scope="worker"
    assert kept.shares.paths == plan_files(list(zip(paths, [5, 20, 2, 18])), 8, 2, 1)  # one plan, reordered per epoch
    plan = route_data([Path(p) for p in paths], 2, 8, 3, rng_seed=1, scope="global")
    # with shuffle_scope="global", every epoch has its own plan (epoch 0's is the seed's plan, as in Spark's fit_paths)
    assert [[e.epoch for e in worker] for worker in plan.shares.paths] == [[0, 1, 2], [0, 1, 2]]
    first = [list(worker[0].items) for worker in plan.shares.paths]
    assert first == plan_files(list(zip(paths, [5, 20, 2, 18])), 8, 2, 1)
    assert [list(worker[1].items) for worker in plan.shares.paths] != first  # a new order in the next epoch
    sizes = [[len(load_item(item)) for item in worker] for worker in first]
    assert sorted(map(sum, sizes)) == [22, 23] and all(s <= 8 for worker in sizes for s in worker)


def test_a_one_shot_iterable_streams_rebatched_minibatches() -> None:
    data = datasets.synthetic_classification(20, 4, 2, seed=3)
    plan = route_data((d for d in data.split(3)), 2, 8, 1, rng_seed=None)
    assert plan.shares.feeds is None and [len(b) for b in plan.shares.stream] == [8, 8, 4]
