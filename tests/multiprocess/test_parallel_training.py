"""ParallelWrapper trains real networks with 2 spawned worker processes over gloo: accuracy, stats, progress."""

from __future__ import annotations

import multiprocessing
from functools import partial

import numpy as np
import pytest

from helpers import assert_replicas_identical, averaging_only, batchnorm_net, lenet_net, mlp_net
from torchspark import datasets, optim
from torchspark.data import save_batches
from torchspark.encoding import AdaptiveThreshold
from torchspark.parallel import ParallelWrapper
from torchspark.stats import STANDARD_PHASES

_lenet = partial(lenet_net, updater=optim.Adam(lr=1e-3))


def test_digits_averaging_reaches_95_percent_with_stats_and_progress_bar(tmp_path, capfd) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = _lenet()
    wrapper = ParallelWrapper(
        net,
        num_workers=2,
        training_mode="averaging",
        averaging_frequency=5,
        rng_seed=0,
        collect_training_stats=True,
        progress=True,
    )
    updates = []
    wrapper.add_progress_listener(updates.append)
    assert wrapper.fit(train, epochs=8, batch_size=16) is net

    accuracy = net.evaluate(test).accuracy()
    assert accuracy >= 0.95, accuracy
    assert net.epoch == 8 and np.isfinite(wrapper.score)
    # 1437 examples split exactly: 718 / 719 per epoch (minibatches of 16, a short one at the cut and at the end)
    assert sorted(r.examples for r in wrapper.last_results) == [8 * 718, 8 * 719]
    assert {u.rank for u in updates} == {0, 1}
    assert "fit x8" in capfd.readouterr().err  # the bar is drawn by this (calling) process

    summary = wrapper.training_stats.summary()
    assert summary["workers"] == 2 and summary["epochs"] == 8 and summary["examples"] == 8 * 1437
    for phase in ("network_init", "data_wait", "fit", "averaging"):
        assert summary["seconds"].get(phase, 0) > 0, phase
    for phase in ("broadcast", "fit", "aggregation"):
        assert summary["driver_seconds"].get(phase, 0) > 0, phase
    # one worker "fit" per minibatch trained; the driver's whole-fit span is counted apart
    assert summary["counts"]["fit"] == summary["minibatches"] == sum(r.iterations for r in wrapper.last_results)
    assert set(summary["seconds"]) | set(summary["driver_seconds"]) <= set(STANDARD_PHASES)
    path = tmp_path / "stats.html"
    wrapper.training_stats.export_html(str(path))
    html = path.read_text()
    for name in ("driver", "worker-0", "worker-1", "network_init", "data_wait", "fit", "averaging"):
        assert name in html, name
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("torchspark-worker")]


def test_digits_sharing_from_batch_files_reaches_95_percent(tmp_path) -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    paths = save_batches(train.split(16), str(tmp_path / "batches"))
    net = _lenet()
    # Adam steps are ~lr = 1e-3 per parameter; a threshold 10x above that skips ~150 dense warm-up steps
    wrapper = ParallelWrapper(
        net,
        num_workers=2,
        training_mode="sharing",
        rng_seed=0,
        progress=False,
        threshold_algorithm=AdaptiveThreshold(initial=1e-2),
        collect_training_stats=True,
    )
    wrapper.fit(paths, epochs=8)  # workers read the files themselves

    accuracy = net.evaluate(test).accuracy()
    assert accuracy >= 0.95, accuracy
    cfg = net.extra_config
    assert cfg["sharing.world_size"] == 2
    assert_replicas_identical(wrapper, 2, net=net)
    assert cfg["sharing.bytes_sent"] < 0.05 * cfg["sharing.dense_bytes"]
    summary = wrapper.training_stats.summary()
    assert summary["replicas_identical"] is True and summary["seconds"].get("exchange", 0) > 0
    assert_replicas_identical(summary, 2, net=net)
    path = tmp_path / "sharing.html"
    wrapper.training_stats.export_html(str(path))
    assert "Gradient encoding" in path.read_text()


def test_a_one_shot_iterable_trains_every_example_once() -> None:
    data = datasets.synthetic_classification(200, 12, 3, seed=2)
    net = mlp_net(12, 16, 3, updater=optim.SGD(lr=0.1))
    wrapper = ParallelWrapper(net, num_workers=2, training_mode="sharing", progress=False)
    wrapper.fit((piece for piece in data.split(30)), batch_size=8)  # re-batched to 8, dealt round-robin
    assert sum(r.examples for r in wrapper.last_results) == 200
    assert sorted(r.iterations for r in wrapper.last_results) == [12, 13]
    assert net.epoch == 1
    assert_replicas_identical(wrapper, 2, net=net)


@pytest.mark.parametrize("mode", ["averaging", "sharing"])
def test_batchnorm_statistics_reach_the_calling_process(mode: str) -> None:
    import torch

    net = batchnorm_net(updater=optim.SGD(lr=0.1))
    data = datasets.synthetic_classification(64, 12, 3, seed=8)
    initial = net.buffers()
    ParallelWrapper(net, num_workers=2, training_mode=mode, **averaging_only(mode, 2), progress=False).fit(
        data, epochs=1, batch_size=8
    )
    assert torch.isfinite(net.buffers()).all() and not torch.allclose(net.buffers(), initial)
    assert int(net.module[1].num_batches_tracked) == 4  # worker 0's minibatches


def test_workers_flush_denormals_unless_told_not_to() -> None:
    from denormal_case import DENORMAL, denormal_net, watched, zero_feature_data

    got = {}
    for flush in (True, False):
        net = denormal_net()
        ParallelWrapper(net, num_workers=2, averaging_frequency=2, progress=False, flush_denormal=flush).fit(
            zero_feature_data(64), epochs=1, batch_size=8
        )
        got[flush] = watched(net)
    assert got[True] == 0.0
    assert got[False] == pytest.approx(DENORMAL, rel=1e-3)
