"""Bounded-staleness gradient sharing (torchspark.training.algorithms.sharing.stale) in threads of one process.

Each test runs the real loop (``StaleSharingAlgorithm.start/epoch/finish``) on one thread per worker over a
``ThreadGroup``; one worker is slowed by a batch iterator that sleeps before every minibatch.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from functools import partial

import pytest
import torch

from helpers import assert_replicas_identical, classification_batches, fit_in_process, mlp_net
from torchspark import DataSet, optim
from torchspark.encoding import AdaptiveThreshold, EncoderConfig
from torchspark.errors import ConfigError, PeerLost, TrainingError, WaitTimeout, WorkerError
from torchspark.training import ALGORITHMS, ThreadGroup
from torchspark.training.algorithms.sharing.ledger import PeerLedger
from torchspark.training.algorithms.sharing.loop import SharingAlgorithm
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.algorithms.sharing.stale import StaleSharingAlgorithm
from torchspark.training.comm.mailbox import ABORT, END, MESSAGE, Envelope, ThreadMailbox
from torchspark.training.config.masters import master_from_json
from torchspark.training.config.shared_master import SharedTrainingMaster
from torchspark.training.hooks import WorkerHooks

ENCODER = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3))


_net = partial(mlp_net, 12, 16, 3, updater=optim.SGD(lr=0.1, momentum=0.9))


def _slowed(batches: list[DataSet], delay_s: float) -> Iterator[DataSet]:
    """Test-only straggler: sleeps before handing out every minibatch."""
    for b in batches:
        time.sleep(delay_s)
        yield b


def _run(
    shards: list[list[DataSet]],
    k: int,
    epochs: int = 2,
    slow_rank: int | None = 0,
    delay_s: float = 0.01,
    encoder: EncoderConfig = ENCODER,
    timeout_s: float = 60.0,
):
    """Every worker's (network, state, extra_config) after a fit of ``epochs`` epochs."""
    world = len(shards)
    group = ThreadGroup(world, timeout_s)
    algo = StaleSharingAlgorithm(SharingSettings(encoder, max_staleness=k))
    results: list = [None] * world
    errors: list[BaseException] = []
    nets = [_net() for _ in range(world)]  # here: initialising modules in parallel threads would share the global RNG

    def worker(rank: int) -> None:
        try:
            comm = group.communicator(rank)
            net = nets[rank]
            state = algo.start(net, comm)
            for e in range(epochs):
                data = _slowed(shards[rank], delay_s) if rank == slow_rank else iter(shards[rank])
                algo.epoch(state, net, data, comm, WorkerHooks(), e)
            _, config = algo.finish(state, net, comm)
            results[rank] = (net, state, config)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            group.abort()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("k", [0, 1, 4])
def test_lag_is_bounded_and_every_message_is_applied_once(k: int) -> None:
    shards = [classification_batches(10, seed=r) for r in range(3)]
    results = _run(shards, k)
    world, steps = 3, 2 * 10
    for _, state, config in results:
        assert len(state.staleness.lags) == steps
        assert max(state.staleness.lags) <= k  # every update computed at most k steps ahead of the slowest peer
        assert state.staleness.sent == steps
        assert state.staleness.applied == world * steps  # every worker's every message, each once
        assert config["sharing.max_staleness"] == k
        assert config["sharing.messages_sent"] == world * steps
        assert config["sharing.messages_applied"] == world * world * steps
        assert config["sharing.max_lag_steps"] == max(max(s.staleness.lags) for _, s, _ in results)
        assert config["sharing.max_lag_steps"] <= k
        # every replica applied the same messages (a lost or extra one would leave a difference of the order of
        # the threshold, 1e-3); only the order, so the float rounding, differs
        assert config["sharing.replica_divergence"] < 1e-5
    # the fast workers really ran ahead of the slowed one when allowed to (the bound is what held them)
    if k >= 1:
        assert max(max(s.staleness.lags) for _, s, _ in results[1:]) >= 1
    assert_replicas_identical([net for net, _, _ in results], world)
    params = [net.params() for net, _, _ in results]
    for p in params[1:]:
        assert torch.equal(p, params[0])  # averaged at the end: identical replicas
    digest = hashlib.sha256(params[0].numpy().tobytes())
    digest.update(results[0][0].buffers().numpy().tobytes())
    assert results[0][2]["sharing.replica_sha256"] == digest.hexdigest()
    assert not torch.equal(params[0], _net().params())  # it trained


def test_replicas_drift_apart_before_the_final_average() -> None:
    """With staleness the replicas apply the messages in different orders and at different times: they differ
    before the end, the divergence is reported, and averaging makes them identical."""
    results = _run([classification_batches(12, seed=r) for r in range(2)], k=4, epochs=1, delay_s=0.005)
    config = results[0][2]
    assert 0.0 < config["sharing.replica_divergence"] < 1e-5  # rounding of a different order, not a lost message
    assert torch.equal(results[0][0].params(), results[1][0].params())


def test_one_worker_equals_the_synchronous_loop_without_overlap() -> None:
    """With nobody to wait for, the loop is compute, encode, apply the own message: exactly the synchronous loop
    with overlap=False, to the last bit (same encoder, residual and threshold dynamics)."""
    shards = [classification_batches(8, seed=3)]
    stale = _run(shards, k=2, epochs=2, slow_rank=None)[0]
    sync_net = _net()
    fit_in_process(sync_net, "sharing", SharingSettings(ENCODER, overlap=False).to_dict(), shards, epochs=2)
    assert torch.equal(stale[0].params(), sync_net.params())
    assert torch.equal(stale[0].updater_state(), sync_net.updater_state())
    assert stale[2]["sharing.messages_applied"] == 16 and stale[2]["sharing.replica_divergence"] == 0.0
    solo_net = _net()  # the in-process runner gives a lone worker a SoloCommunicator (no group at all)
    fit_in_process(solo_net, "stale_sharing", SharingSettings(ENCODER, max_staleness=0).to_dict(), shards, epochs=2)
    assert torch.equal(solo_net.params(), sync_net.params())


def test_unequal_partitions_and_a_worker_without_data_end() -> None:
    shards = [classification_batches(9, seed=1), classification_batches(3, seed=2), []]
    results = _run(shards, k=1, epochs=2, slow_rank=1)
    sent = 2 * (9 + 3)
    for _, state, config in results:
        assert config["sharing.messages_sent"] == sent
        assert config["sharing.messages_applied"] == 3 * sent
        assert state.staleness.applied == sent
    assert [s.staleness.sent for _, s, _ in results] == [18, 6, 0]
    assert torch.equal(results[0][0].params(), results[2][0].params())


def test_calibrated_start_is_agreed_before_the_mailbox_opens() -> None:
    """The default calibrated threshold: one all-gather before the first post, every worker starts alike."""
    shards = [classification_batches(5, seed=1), classification_batches(5, seed=2)]
    results = _run(shards, k=2, epochs=1, encoder=EncoderConfig())
    starts = {s.start_threshold for _, s, _ in results}
    assert len(starts) == 1 and next(iter(starts)) > 0
    assert results[0][2]["sharing.messages_applied"] == 2 * 10


def test_sequence_gap_and_duplicate_are_detected() -> None:
    group = ThreadGroup(2, 5.0)
    sender, receiver = ThreadMailbox(group.communicator(0)), ThreadMailbox(group.communicator(1))
    sender.post(Envelope(0, 0, MESSAGE))
    sender.post(Envelope(2, 0, MESSAGE))  # message 1 lost
    ledger = PeerLedger([0], epoch=0)
    assert ledger.accept(*receiver.receive({0}, 1.0)) is True
    with pytest.raises(TrainingError, match="message 1 of worker 0 in epoch 0 was lost"):
        ledger.accept(*receiver.receive({0}, 1.0))
    ledger = PeerLedger([0], epoch=0)
    ledger.accept(0, Envelope(0, 0, MESSAGE))
    with pytest.raises(TrainingError, match="repeated"):
        ledger.accept(0, Envelope(0, 0, MESSAGE))
    with pytest.raises(TrainingError, match="epoch 1 while this worker is in epoch 0"):
        ledger.accept(0, Envelope(1, 1, MESSAGE))
    with pytest.raises(TrainingError, match="lost"):  # an END marker announcing more than arrived
        ledger.accept(0, Envelope(3, 0, END))
    ledger.accept(0, Envelope(1, 0, END))
    assert ledger.complete()
    with pytest.raises(TrainingError, match="after its end marker"):
        ledger.accept(0, Envelope(1, 0, MESSAGE))


def test_a_peers_abort_marker_is_a_peer_lost_naming_it() -> None:
    ledger = PeerLedger([0, 2], epoch=3)
    ledger.accept(2, Envelope(0, 3, MESSAGE))
    with pytest.raises(PeerLost, match="worker 2 failed during epoch 3"):
        ledger.accept(2, Envelope(0, 3, ABORT))  # whatever its seq: the sender failed


def test_a_stuck_peer_times_out_naming_the_setting() -> None:
    """A worker that never sends: its peer waits the communicator's timeout, then names rendezvous_timeout_s."""
    group = ThreadGroup(2, 1.0)
    algo = StaleSharingAlgorithm(SharingSettings(ENCODER, max_staleness=0))
    comm = group.communicator(0)
    net = _net()
    state = algo.start(net, comm)
    with pytest.raises(WaitTimeout, match="rendezvous_timeout_s=1.0"):
        algo.epoch(state, net, iter(classification_batches(3, seed=1)), comm, WorkerHooks(), 0)


def test_in_process_runner_fit_with_staleness_matches_counts() -> None:
    """Through the worker task (the path the runners take): settings round-trip and extra_config reaches the net."""
    net = _net()
    settings = SharingSettings(ENCODER, max_staleness=1)
    assert SharingSettings.from_dict(settings.to_dict()) == settings
    results = fit_in_process(
        net, "stale_sharing", settings.to_dict(), [classification_batches(4, seed=1), classification_batches(6, seed=2)]
    )
    assert net.extra_config["sharing.max_staleness"] == 1
    assert net.extra_config["sharing.messages_sent"] == 10
    assert net.extra_config["sharing.messages_applied"] == 20
    assert_replicas_identical(results, 2, net=net)


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_max_staleness_values_are_validated(value) -> None:
    with pytest.raises(ConfigError, match=f"max_staleness must be None .* got {value!r}"):
        SharingSettings(max_staleness=value)
    with pytest.raises(ConfigError, match="SharedTrainingMaster: max_staleness"):
        SharedTrainingMaster(max_staleness=value)


def test_max_staleness_refuses_combinations_that_cannot_work(tmp_path) -> None:
    with pytest.raises(ConfigError, match="max_staleness=1 is the asynchronous mode and overlap=False"):
        SharedTrainingMaster(max_staleness=1, overlap=False)
    with pytest.raises(ConfigError, match="max_staleness=2 checkpoints at epoch ends only.*checkpoint_every=3"):
        SharedTrainingMaster(max_staleness=2, checkpoint_directory=str(tmp_path), checkpoint_every=3)
    assert SharedTrainingMaster(max_staleness=2, checkpoint_directory=str(tmp_path)).max_staleness == 2
    master = SharedTrainingMaster(max_staleness=3)
    assert master.algorithm_settings()["max_staleness"] == 3
    assert SharedTrainingMaster().algorithm_settings()["max_staleness"] is None
    assert master_from_json(json.dumps(master.to_dict())).max_staleness == 3


def test_worker_error_mid_fit_is_reported_and_leaves_no_thread() -> None:
    """A worker failing mid-epoch (NaN data) aborts the group: its peer stops waiting at once (not after the
    timeout), the driver names the failing worker, no mailbox thread is left."""
    poisoned = classification_batches(6, seed=6)
    x = poisoned[3].features.clone()
    x[2] = float("nan")
    poisoned[3] = DataSet(x, poisoned[3].labels)
    net = _net()
    settings = SharingSettings(ENCODER, max_staleness=1).to_dict()
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(WorkerError, match="worker 1 failed"):
        fit_in_process(net, "stale_sharing", settings, [classification_batches(40, seed=7), poisoned], timeout_s=300.0)
    leftover = {t.name for t in threading.enumerate()} - before
    assert not [n for n in leftover if n.startswith("torchspark")], leftover


def test_parallel_wrapper_passes_max_staleness_to_its_master() -> None:
    from torchspark.parallel import ParallelWrapper

    wrapper = ParallelWrapper(_net(), num_workers=2, training_mode="sharing", max_staleness=2, progress=False)
    assert wrapper.master.max_staleness == 2
    assert wrapper.master.algorithm_settings()["max_staleness"] == 2
    with pytest.raises(ConfigError, match="max_staleness must be None .* got -3"):
        ParallelWrapper(_net(), num_workers=2, training_mode="sharing", max_staleness=-3)
    with pytest.raises(ConfigError, match="pass either master= or the options .*max_staleness"):
        ParallelWrapper(_net(), num_workers=2, master=SharedTrainingMaster(), max_staleness=1)


def test_max_staleness_refuses_the_sharded_topology() -> None:
    """Point-to-point messages have no collective topology to shard (active once the topology option exists)."""
    import dataclasses

    if "topology" not in {f.name for f in dataclasses.fields(SharedTrainingMaster)}:
        pytest.skip("SharedTrainingMaster has no topology option in this build")
    with pytest.raises(ConfigError, match="topology='sharded'"):
        SharedTrainingMaster(max_staleness=1, topology="sharded")


def test_the_master_picks_the_stale_algorithm_from_max_staleness() -> None:
    """Bounded staleness is its own algorithm ("stale_sharing"); the master's mode follows max_staleness, and each
    algorithm refuses the other's settings."""
    assert SharedTrainingMaster().mode == "sharing"
    assert SharedTrainingMaster(max_staleness=2).mode == "stale_sharing"
    assert ALGORITHMS["stale_sharing"] is StaleSharingAlgorithm and ALGORITHMS["sharing"] is SharingAlgorithm
    settings = SharedTrainingMaster(max_staleness=2).algorithm_settings()
    assert ALGORITHMS["stale_sharing"].from_settings(settings).settings.max_staleness == 2
    with pytest.raises(ConfigError, match="'stale_sharing' algorithm"):
        ALGORITHMS["sharing"].from_settings(settings)
    with pytest.raises(ConfigError, match="max_staleness=None use the synchronous 'sharing' algorithm"):
        ALGORITHMS["stale_sharing"].from_settings(SharedTrainingMaster().algorithm_settings())
