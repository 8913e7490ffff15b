"""pin_memory: minibatches of CUDA workers are pinned on the loading thread; CPU workers never pin (pinning needs
CUDA: on a CPU-only torch ``pin_memory()`` raises, so a CPU fit that pinned would fail)."""

from __future__ import annotations

import pytest
import torch

from helpers import classification_batches, fit_in_process, mlp_net
from torchspark import DataSet, ParameterAveragingTrainingMaster, SharedTrainingMaster, master_from_json
from torchspark.errors import ConfigError
from torchspark.nn import NetworkBlueprint
from torchspark.parallel import ParallelWrapper
from torchspark.training import WorkerTask
from torchspark.training.comm import SoloCommunicator
from torchspark.training.driver.fit import build_task
from torchspark.training.hooks import NullRecorder
from torchspark.training.worker.devices import pins_memory
from torchspark.training.worker.loop import ItemSource, batch_loader, load_item, run_worker

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize(
    ("option", "device", "pins"),
    [
        (None, "cuda", True),
        (None, "cuda:1", True),
        (True, "cuda:0", True),
        (False, "cuda:0", False),  # turned off
        (None, "cpu", False),
        (True, "cpu", False),
        (False, "cpu", False),  # pinning needs CUDA: never on CPU
    ],
)
def test_pins_memory_only_for_cuda_workers_unless_turned_off(option: bool | None, device: str, pins: bool) -> None:
    assert pins_memory(option, device) is pins


@pytest.mark.parametrize(("option", "device"), [(None, "cpu"), (True, "cpu"), (False, "cuda:0")])
def test_a_worker_that_does_not_pin_loads_items_as_they_are(option: bool | None, device: str) -> None:
    load = batch_loader(option, device)
    assert load is load_item
    assert not load(DataSet(torch.ones(2, 3), torch.zeros(2, dtype=torch.long))).features.is_pinned()


@pytest.mark.parametrize("option", [None, True])
def test_a_cuda_worker_pins_every_loaded_minibatch(option: bool | None) -> None:
    """The loader of a CUDA worker copies into pinned memory: where torch has CUDA the batch comes back pinned; on
    a CPU-only torch the copy is attempted and refused (so an option that were ignored would fail here too)."""
    load = batch_loader(option, "cuda:0")
    batch = DataSet(torch.ones(4, 3), torch.zeros(4, dtype=torch.long))
    if not CUDA:
        with pytest.raises(RuntimeError):
            load(batch)
        return
    pinned = load(batch)
    assert pinned.features.is_pinned() and pinned.labels is not None and pinned.labels.is_pinned()
    assert torch.equal(pinned.features, batch.features)


def test_pin_memory_is_validated_and_round_trips_through_json() -> None:
    with pytest.raises(
        ConfigError,
        match=r"pin_memory must be True or False or None \(pin on CUDA workers\), "
        r"got 'yes'",
    ):
        SharedTrainingMaster(pin_memory="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="pin_memory must be True or False"):
        ParallelWrapper(mlp_net(4, 4, 2), num_workers=1, pin_memory=1, progress=False)
    for value in (None, True, False):
        master = ParameterAveragingTrainingMaster(pin_memory=value)
        assert master_from_json(master.to_json()).pin_memory is value


@pytest.mark.parametrize("value", [None, True, False])
def test_the_masters_pin_memory_reaches_the_workers_task(value: bool | None) -> None:
    master = ParameterAveragingTrainingMaster(pin_memory=value)
    task = build_task(mlp_net(4, 4, 2), master, 1, False, NullRecorder())
    assert task.pin_memory is value
    assert ParallelWrapper(mlp_net(4, 4, 2), num_workers=1, pin_memory=value, progress=False).master.pin_memory is value


@pytest.mark.parametrize("prefetch", [0, 2])
def test_cpu_workers_train_the_same_whatever_pin_memory_says(prefetch: int) -> None:
    """On CPU the option is a no-op: the same parameters as without it (and no pin_memory call, which would raise
    on a CPU-only torch)."""
    shards = [classification_batches(4, seed=r, n_features=6) for r in range(2)]
    nets = []
    for option in (None, True, False):
        net = mlp_net(6, 8, 3)
        fit_in_process(
            net,
            "averaging",
            {"averaging_frequency": 2, "save_updater": True},
            shards,
            prefetch=prefetch,
            pin_memory=option,
        )
        nets.append(net.params())
    assert torch.equal(nets[0], nets[1]) and torch.equal(nets[0], nets[2])


def _pinned_handouts() -> int:
    torch.cuda.init()  # host_memory_stats() is empty until torch.cuda is initialised (pinning alone does not)
    torch.empty(1).pin_memory()  # nor before the pinned allocator's first allocation
    stats = torch.cuda.host_memory_stats()
    for key in ("active_requests.allocated", "allocations.allocated", "allocated.allocated", "num_host_alloc"):
        if key in stats:
            return int(stats[key])
    pytest.skip(f"this torch's host_memory_stats() has none of the keys this test reads: {sorted(stats)}")


@pytest.mark.skipif(not CUDA, reason="needs CUDA (the GPU check, benchmarks/gpu_check.py, runs it on a GPU)")
@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_cuda_worker_loads_through_pinned_memory_unless_told_not_to(prefetch: int) -> None:
    net = mlp_net(6, 8, 3)
    batches = classification_batches(6, seed=0, n_features=6)
    handed: dict[bool | None, int] = {}
    params = {}
    for option in (False, None):
        task = WorkerTask(
            "averaging",
            {"averaging_frequency": 2, "save_updater": True},
            NetworkBlueprint.of(net).to_bytes(),
            prefetch=prefetch,
            pin_memory=option,
        )
        before = _pinned_handouts()
        result = run_worker(task, ItemSource(batches), SoloCommunicator(), device="cuda:0")
        torch.cuda.synchronize()
        handed[option] = _pinned_handouts() - before
        params[option] = result.params
    # other host-to-device copies (the updater's scalars) take pinned buffers too: at least one more per minibatch
    assert handed[None] - handed[False] >= len(batches)
    assert params[None] is not None and params[False] is not None
    torch.testing.assert_close(params[None], params[False], rtol=0, atol=0)
