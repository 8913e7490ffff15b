"""Gradient sharing's ``topology`` with real worker processes (ParallelWrapper, 3 workers over gloo): the sharded
exchange trains to exactly the parameters of the all-gather one, every replica equal, and ``"auto"`` switches on
the worker count."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from helpers import mlp_net
from torchspark import Network, datasets, models, optim
from torchspark.encoding import FixedThreshold
from torchspark.errors import ConfigError
from torchspark.parallel import ParallelWrapper
from torchspark.training.config.shared_master import SharedTrainingMaster

DATA = datasets.synthetic_classification(150, 12, 3, seed=5)


def _fit(workers: int, shared_memory: bool = False, **options: Any) -> tuple[Network, ParallelWrapper]:
    net = mlp_net(12, 16, 3, updater=optim.SGD(lr=0.1))
    master = SharedTrainingMaster(
        batch_size_per_worker=8,
        rng_seed=0,
        shared_memory_allreduce=shared_memory,
        threshold_algorithm=FixedThreshold(0.05),
        collect_training_stats=True,
        **options,
    )
    wrapper = ParallelWrapper(net, num_workers=workers, master=master, progress=False)
    wrapper.fit(DATA, epochs=2, batch_size=8)
    return net, wrapper


@pytest.fixture(scope="module")
def gloo_fits() -> dict[str, tuple[Network, ParallelWrapper]]:
    return {topology: _fit(3, topology=topology) for topology in ("all_gather", "sharded")}


def test_sharded_fit_equals_all_gather_fit_bit_for_bit(gloo_fits: dict[str, tuple[Network, ParallelWrapper]]) -> None:
    plain, sharded = gloo_fits["all_gather"][0], gloo_fits["sharded"][0]
    assert plain.extra_config["sharing.topology"] == "all_gather"
    assert sharded.extra_config["sharing.topology"] == "sharded"
    assert plain.extra_config["sharing.bytes_sent"] > 0
    assert not torch.equal(plain.params(), Network(models.mlp(12, 16, 3), seed=0).params())  # it trained
    formats = gloo_fits["sharded"][1].training_stats.encoding().format_names
    assert {"sparse", "bitmap"} <= set(formats), formats  # both message formats went through the shards
    assert torch.equal(plain.params(), sharded.params())
    assert plain.extra_config["sharing.replica_sha256"] == sharded.extra_config["sharing.replica_sha256"]


def test_posted_gathers_through_shared_memory_equal_the_exchange_thread_bit_for_bit(
    gloo_fits: dict[str, tuple[Network, ParallelWrapper]],
) -> None:
    """Co-located workers overlap through posted shared-memory gathers (no exchange thread); over gloo the exchange
    thread does it. Same messages in the same order: the same parameters."""
    threaded, _ = gloo_fits["all_gather"]
    posted, wrapper = _fit(3, shared_memory=True, topology="all_gather")
    assert threaded.extra_config["sharing.overlap_via"] == "thread"
    assert posted.extra_config["sharing.overlap_via"] == "shared_memory"
    assert len({r.param_checksum for r in wrapper.last_results}) == 1
    assert torch.equal(threaded.params(), posted.params())
    assert threaded.extra_config["sharing.replica_sha256"] == posted.extra_config["sharing.replica_sha256"]
    off, _ = _fit(2, shared_memory=True, topology="all_gather", overlap=False)
    assert off.extra_config["sharing.overlap_via"] == "off"


@pytest.mark.parametrize("topology", ["all_gather", "sharded"])
def test_every_replica_is_identical(gloo_fits: dict[str, tuple[Network, ParallelWrapper]], topology: str) -> None:
    net, wrapper = gloo_fits[topology]
    checksums = [r.param_checksum for r in sorted(wrapper.last_results, key=lambda r: r.rank)]
    assert len(checksums) == 3 and checksums[0] is not None
    assert checksums == [checksums[0]] * 3, checksums


@pytest.mark.parametrize("workers,expected", [(3, "sharded"), (2, "all_gather")])
def test_auto_shards_above_shard_above_workers(workers: int, expected: str) -> None:
    """shard_above_workers=2: 3 workers shard, 2 do not (here through the shared-memory communicator)."""
    net, wrapper = _fit(workers, shared_memory=True, topology="auto", shard_above_workers=2)
    assert net.extra_config["sharing.topology"] == expected
    checksums = {r.param_checksum for r in wrapper.last_results}
    assert len(checksums) == 1


def test_parallel_wrapper_topology_options_reach_the_master() -> None:
    net = Network(models.mlp(12, 16, 3), seed=0)
    wrapper = ParallelWrapper(
        net, num_workers=2, training_mode="sharing", topology="sharded", shard_above_workers=5, progress=False
    )
    assert (wrapper.master.topology, wrapper.master.shard_above_workers) == ("sharded", 5)
    assert wrapper.master.algorithm_settings()["topology"] == "sharded"
    with pytest.raises(ConfigError, match=r"topology must be one of \['auto', 'all_gather', 'sharded'\], got 'ring'"):
        ParallelWrapper(net, num_workers=2, training_mode="sharing", topology="ring")
    with pytest.raises(ConfigError, match="shard_above_workers must be an integer >= 1, got 0"):
        ParallelWrapper(net, num_workers=2, training_mode="sharing", shard_above_workers=0)
    with pytest.raises(ConfigError, match="topology must be one of"):
        dataclasses.replace(SharedTrainingMaster(), topology="all-gather")
