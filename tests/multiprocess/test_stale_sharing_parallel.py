"""Bounded-staleness gradient sharing (``max_staleness``) in ParallelWrapper: real worker processes over gloo
point-to-point, one of them slowed by a module that sleeps on its rank."""

from __future__ import annotations

import hashlib
import multiprocessing
import time

import pytest
from _faulty import FailingForward
from _slow import SlowOnRank

from helpers import assert_replicas_identical, mlp_net
from torchspark import Network, datasets, models, optim
from torchspark.encoding import AdaptiveThreshold
from torchspark.errors import WorkerError
from torchspark.parallel import ParallelWrapper


def test_digits_with_a_straggler_and_max_staleness_1_reaches_95_percent() -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    net = Network(
        SlowOnRank(models.lenet(1, 10, 8, 8), slow_rank=1, delay_s=0.003), updater=optim.Adam(lr=1e-3), seed=0
    )
    # the same settings as the synchronous digits test (tests/multiprocess/test_parallel_training.py): >= 95 %
    wrapper = ParallelWrapper(
        net,
        num_workers=2,
        training_mode="sharing",
        rng_seed=0,
        progress=False,
        threshold_algorithm=AdaptiveThreshold(initial=1e-2),
        collect_training_stats=True,
        max_staleness=1,
    )
    wrapper.fit(train, epochs=8, batch_size=16)

    accuracy = net.evaluate(test).accuracy()
    assert accuracy >= 0.95, accuracy
    cfg = net.extra_config
    steps = sum(r.iterations for r in wrapper.last_results)
    assert cfg["sharing.max_staleness"] == 1
    assert cfg["sharing.messages_sent"] == steps
    assert cfg["sharing.messages_applied"] == 2 * steps  # every message applied on both workers, once
    assert 0 <= cfg["sharing.max_lag_steps"] <= 1
    assert cfg["sharing.replica_divergence"] > 0  # the replicas did drift apart before the final average
    # finish() compared both ranks' checksums; the driver's model is rank 0's
    digest = hashlib.sha256(net.params().numpy().tobytes())
    digest.update(net.buffers().numpy().tobytes())
    assert cfg["sharing.replica_sha256"] == digest.hexdigest()
    assert_replicas_identical(wrapper, 2, net=net)
    summary = wrapper.training_stats.summary()
    assert summary["seconds"].get("exchange", 0) > 0  # the fast worker waited for the slow one


def test_unequal_partitions_and_a_worker_without_data_do_not_hang() -> None:
    data = datasets.synthetic_classification(16, 12, 3, seed=2)
    net = mlp_net(12, 16, 3, updater=optim.SGD(lr=0.1))
    wrapper = ParallelWrapper(
        net, num_workers=3, training_mode="sharing", progress=False, max_staleness=0, rendezvous_timeout_s=60.0
    )
    wrapper.fit(data, epochs=3, batch_size=8)  # 6 / 5 / 5 examples cut at 8: 1 / 1 / 2 minibatches
    assert sorted(r.iterations for r in wrapper.last_results) == [3, 3, 6]
    cfg = net.extra_config
    assert cfg["sharing.messages_sent"] == 12 and cfg["sharing.messages_applied"] == 36
    assert_replicas_identical(wrapper, 3, net=net)
    # a one-shot iterable is dealt round-robin by minibatch: two minibatches, the third worker gets none
    wrapper.fit((piece for piece in data.split(8)), batch_size=8)
    assert sorted(r.iterations for r in wrapper.last_results) == [0, 1, 1]
    cfg = net.extra_config
    assert cfg["sharing.messages_sent"] == 2 and cfg["sharing.messages_applied"] == 6
    assert_replicas_identical(wrapper, 3, net=net)


def test_a_failing_worker_is_reported_and_its_peers_stop() -> None:
    """Worker 1 raises mid-epoch while worker 0 waits on its messages: the fit fails with worker 1's own error
    (not a peer's dropped connection), well before the rendezvous timeout."""
    data = datasets.synthetic_classification(400, 12, 3, seed=1)
    net = Network(FailingForward(12, 3, after=4, rank=1), updater=optim.SGD(lr=0.1), seed=0)
    wrapper = ParallelWrapper(
        net, num_workers=2, training_mode="sharing", progress=False, max_staleness=1, rendezvous_timeout_s=120.0
    )
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        wrapper.fit(data, epochs=1, batch_size=8)
    assert str(info.value).startswith("worker 1 failed: _faulty.InjectedFailure: injected failure in forward call 5")
    assert time.monotonic() - started < 120.0  # not the timeout: the peer was stopped
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("torchspark-worker")]
