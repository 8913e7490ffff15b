"""Gradient sharing worker loop (torchspark.training.algorithms.sharing.loop) in threads of one process, against a
reference loop."""

from __future__ import annotations

import hashlib
import threading
from functools import partial

import pytest
import torch

from helpers import assert_replicas_identical, classification_batches, fit_in_process, mlp_net
from reference_loops import dense_exchange, sharing_reference
from torchspark import DataSet, Network, optim
from torchspark.encoding import (
    AdaptiveThreshold,
    EncoderConfig,
    EncoderState,
    FixedThreshold,
    ThresholdState,
    agree_threshold,
    average_states,
    calibrated_threshold,
    encode_step,
)
from torchspark.errors import ConfigError, EncodingError, TrainingError, WorkerError
from torchspark.training import (
    ALGORITHMS,
    SoloCommunicator,
    ThreadGroup,
)
from torchspark.training.algorithms.sharing.loop import SharingAlgorithm
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.algorithms.sharing.state import RESIDUAL_KEY, THRESHOLD_KEY, WORLD_KEY, restore_residual

ENCODER = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3), shake_frequency=4)


_net = partial(mlp_net, 12, 16, 3, updater=optim.SGD(lr=0.1, momentum=0.9))


def _fit(
    net: Network,
    shards: list[list[DataSet]],
    epochs: int,
    overlap: bool,
    timeout_s: float = 30.0,
    encoder: EncoderConfig = ENCODER,
):
    settings = SharingSettings(encoder, overlap=overlap).to_dict()
    return fit_in_process(net, "sharing", settings, shards, epochs=epochs, timeout_s=timeout_s)


def _reference(net: Network, shards: list[list[DataSet]], epochs: int, overlap: bool):
    return sharing_reference(net, shards, epochs, overlap, ENCODER)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("layout", ["one_worker", "identical_shards", "distinct_shards"])
def test_distributed_run_matches_reference_loop(overlap: bool, layout: str) -> None:
    batches = classification_batches(6, seed=1)
    shards = {
        "one_worker": [batches],
        "identical_shards": [batches, batches],
        "distinct_shards": [batches, classification_batches(6, seed=2)],
    }[layout]
    net = _net()
    replicas, states = _reference(net, shards, epochs=2, overlap=overlap)
    results = _fit(net, shards, epochs=2, overlap=overlap)

    torch.testing.assert_close(net.params(), replicas[0].params(), rtol=0, atol=0)
    for replica in replicas[1:]:  # the reference replicas agree too (they apply the same sums)
        torch.testing.assert_close(replica.params(), replicas[0].params(), atol=0, rtol=0)
    updater = torch.stack([r.updater_state() for r in replicas]).mean(0)
    torch.testing.assert_close(net.updater_state(), updater)
    for rank, state in enumerate(states):
        torch.testing.assert_close(net.extra_state[RESIDUAL_KEY.format(rank=rank)], state.residual)
    expected = average_states([s.threshold_state for s in states])
    saved = ThresholdState.from_tensor(net.extra_state[THRESHOLD_KEY])
    assert saved.threshold == pytest.approx(expected.threshold)
    assert saved.last_sparsity == pytest.approx(expected.last_sparsity)
    assert [r.iterations for r in results] == [12] * len(shards)
    assert_replicas_identical(results, len(shards), net=net)
    assert net.extra_config["sharing.world_size"] == len(shards)
    assert 0 < net.extra_config["sharing.bytes_sent"] < net.extra_config["sharing.dense_bytes"]
    assert net.extra_config["sharing.dense_bytes"] == 4 * net.num_params() * 12 * len(shards)
    assert not torch.equal(net.params(), _net().params())  # it trained


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("layout", ["distinct_shards", "worker_without_data"])
def test_calibrated_start_is_agreed_and_matches_reference(overlap: bool, layout: str) -> None:
    """The default (calibrated) start: every worker calibrates from its first update, all start from the geometric
    mean (a worker without data does not vote), the run equals the reference loop and the replicas agree."""
    shards = {
        "distinct_shards": [classification_batches(6, seed=1), classification_batches(6, seed=2)],
        "worker_without_data": [classification_batches(6, seed=1), [], classification_batches(3, seed=2)],
    }[layout]
    encoder = EncoderConfig()  # AdaptiveThreshold(initial="calibrated")
    net = _net()
    replicas, states = sharing_reference(net, shards, 2, overlap, encoder)
    results = _fit(net, shards, epochs=2, overlap=overlap, encoder=encoder)

    torch.testing.assert_close(net.params(), replicas[0].params(), rtol=0, atol=0)
    for rank, state in enumerate(states):
        torch.testing.assert_close(net.extra_state[RESIDUAL_KEY.format(rank=rank)], state.residual)
    firsts = [_net().compute_update(shard[0]) if shard else None for shard in shards]  # from the start
    locals_ = [calibrated_threshold(u, 1e-3) if u is not None else None for u in firsts]
    assert len({t for t in locals_ if t is not None}) == 2  # the workers really had different values to agree on
    assert net.extra_config["sharing.start_threshold"] == pytest.approx(agree_threshold(locals_), rel=1e-12)
    # finish() compared every rank's checksum with rank 0's; rank 0's is the driver's merged model
    digest = hashlib.sha256(net.params().numpy().tobytes())
    digest.update(net.buffers().numpy().tobytes())
    assert net.extra_config["sharing.replica_sha256"] == digest.hexdigest()
    assert [r.iterations for r in results] == [2 * len(shard) for shard in shards]
    assert_replicas_identical(results, len(shards), net=net)


def test_a_calibrated_threshold_state_is_kept_by_the_next_fit() -> None:
    shards = [classification_batches(4, seed=1), classification_batches(4, seed=2)]
    net = _net()
    _fit(net, shards, epochs=1, overlap=True, encoder=EncoderConfig())
    saved = ThresholdState.from_tensor(net.extra_state[THRESHOLD_KEY])
    assert saved.calibrated
    state = SharingAlgorithm(SharingSettings(EncoderConfig())).start(net, SoloCommunicator())
    # the threshold carries over; the sparsity does not ("stepped" means stepped in this fit)
    assert state.encoder.threshold_state == ThresholdState(saved.threshold)
    assert state.start_threshold == saved.threshold
    # a state saved before any calibration (no data anywhere) starts over, also with DL4J's fixed start
    net.extra_state[THRESHOLD_KEY] = ThresholdState(None).to_tensor()
    fixed = SharingAlgorithm(SharingSettings(EncoderConfig(AdaptiveThreshold(initial=1e-4))))
    assert fixed.start(net, SoloCommunicator()).encoder.threshold_state == ThresholdState(1e-4)


def test_unequal_shards_terminate_and_match_reference() -> None:
    shards = [classification_batches(7, seed=3), classification_batches(2, seed=4), []]  # one worker has no data at all
    for overlap in (True, False):
        net = _net(seed=1)
        replicas, _ = _reference(net, shards, epochs=2, overlap=overlap)
        results = _fit(net, shards, epochs=2, overlap=overlap, timeout_s=20.0)
        assert [r.iterations for r in results] == [14, 4, 0]
        torch.testing.assert_close(net.params(), replicas[0].params(), rtol=0, atol=0)
        assert_replicas_identical(results, len(shards), net=net)


def test_threshold_average_skips_the_worker_that_never_stepped() -> None:
    shards = [classification_batches(7, seed=3), classification_batches(2, seed=4), []]  # rank 2 gets no data
    net = _net(seed=1)
    _, states = _reference(net, shards, epochs=1, overlap=False)
    _fit(net, shards, epochs=1, overlap=False)
    saved = ThresholdState.from_tensor(net.extra_state[THRESHOLD_KEY])
    stepped = [s.threshold_state for s in states[:2]]
    assert saved.threshold == pytest.approx(sum(s.threshold for s in stepped) / 2)
    assert saved.last_sparsity == pytest.approx(sum(s.last_sparsity for s in stepped) / 2)
    with_idle = sum(s.threshold_state.threshold for s in states) / 3
    assert saved.threshold != pytest.approx(with_idle), "the idle worker's initial threshold must be left out"
    # the next fit starts from the averaged threshold without a sparsity: "stepped" means "stepped in that fit"
    carried = SharingAlgorithm(SharingSettings(ENCODER)).start(net, SoloCommunicator()).encoder.threshold_state
    assert carried == ThresholdState(saved.threshold)


def test_state_carries_across_fits_and_save_load(tmp_path) -> None:
    """Two fits of one epoch equal one fit of two epochs (identical shards: the end-of-fit averages are no-ops),
    which holds only if residuals, threshold state and the step counter survive the first fit -- and a save/load."""
    batches = classification_batches(5, seed=5)
    shards = [batches, batches]
    once = _net()
    _fit(once, shards, epochs=2, overlap=True)

    twice = _net()
    _fit(twice, shards, epochs=1, overlap=True)
    assert {RESIDUAL_KEY.format(rank=0), RESIDUAL_KEY.format(rank=1), THRESHOLD_KEY, WORLD_KEY} <= set(
        twice.extra_state
    )
    assert torch.count_nonzero(twice.extra_state[RESIDUAL_KEY.format(rank=0)]) > 0
    twice.save(str(tmp_path / "model"))
    loaded = Network.load(str(tmp_path / "model"))
    _fit(twice, shards, epochs=1, overlap=True)
    torch.testing.assert_close(twice.params(), once.params())

    _fit(loaded, shards, epochs=1, overlap=True)
    torch.testing.assert_close(loaded.params(), once.params())
    torch.testing.assert_close(
        loaded.extra_state[RESIDUAL_KEY.format(rank=1)], once.extra_state[RESIDUAL_KEY.format(rank=1)]
    )

    fresh = _net()  # without the carried state the second epoch differs: the comparison above has teeth
    _fit(fresh, shards, epochs=1, overlap=True)
    fresh.extra_state.clear()
    _fit(fresh, shards, epochs=1, overlap=True)
    assert not torch.allclose(fresh.params(), once.params())


def test_restore_residual_same_and_different_world_size() -> None:
    r0, r1 = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.25, 1.0, -0.5])
    saved = {
        RESIDUAL_KEY.format(rank=0): r0,
        RESIDUAL_KEY.format(rank=1): r1,
        RESIDUAL_KEY.format(rank=2): torch.full((3,), 9.0),  # stale key of an earlier, larger fit: ignored
        WORLD_KEY: torch.tensor([2]),
    }
    assert torch.equal(restore_residual(saved, 1, 2, 3, "cpu"), r1)
    assert torch.equal(restore_residual(saved, 0, 3, 3, "cpu"), r0 + r1)  # mass preserved on rank 0
    assert torch.equal(restore_residual(saved, 2, 3, 3, "cpu"), torch.zeros(3))
    assert torch.equal(restore_residual({}, 0, 2, 3, "cpu"), torch.zeros(3))
    with pytest.raises(TrainingError, match="3 elements but the network has 4"):
        restore_residual(saved, 0, 2, 4, "cpu")


def test_fixed_threshold_ignores_saved_threshold_state() -> None:
    net = _net()
    net.extra_state[THRESHOLD_KEY] = ThresholdState(0.5, 0.01).to_tensor()
    adaptive = SharingAlgorithm(SharingSettings(EncoderConfig(AdaptiveThreshold())))
    assert adaptive.start(net, SoloCommunicator()).encoder.threshold_state.threshold == 0.5
    fixed = SharingAlgorithm(SharingSettings(EncoderConfig(FixedThreshold(2e-3))))
    assert fixed.start(net, SoloCommunicator()).encoder.threshold_state.threshold == 2e-3


def test_diverged_replicas_raise_training_error() -> None:
    group = ThreadGroup(2, timeout_s=10)
    algo = SharingAlgorithm(SharingSettings())
    errors: list[BaseException] = []

    def finish(rank: int) -> None:
        net = _net()
        if rank == 1:
            net.apply_update(torch.full((net.num_params(),), 1e-6))
        comm = group.communicator(rank)
        try:
            algo.finish(algo.start(net, comm), net, comm)
        except TrainingError as e:
            errors.append(e)

    threads = [threading.Thread(target=finish, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 2 and all("replicas diverged" in str(e) and "worker(s) [1]" in str(e) for e in errors), errors


@pytest.mark.parametrize("overlap", [True, False])
def test_worker_error_mid_fit_is_clean(overlap: bool) -> None:
    poisoned = classification_batches(6, seed=6)
    x = poisoned[3].features.clone()
    x[2] = float("nan")
    poisoned[3] = DataSet(x, poisoned[3].labels)
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(WorkerError, match="worker 1 failed"):
        _fit(_net(), [classification_batches(6, seed=7), poisoned], epochs=1, overlap=overlap, timeout_s=20.0)
    leftover = {t.name for t in threading.enumerate()} - before
    assert not [n for n in leftover if n.startswith("torchspark")], leftover


def test_malformed_payload_and_settings_are_refused() -> None:
    with pytest.raises(EncodingError, match="worker 0 sent a malformed"):
        dense_exchange(SoloCommunicator(), b"\x07", 10, "cpu")
    with pytest.raises(EncodingError, match="update of 10 elements but this network has 12"):
        message, _ = encode_step(torch.ones(10), EncoderState.create(EncoderConfig(FixedThreshold(0.5)), 10), 0)
        from torchspark.encoding import to_bytes

        dense_exchange(SoloCommunicator(), b"\x01" + to_bytes(message), 12, "cpu")
    with pytest.raises(ConfigError, match="overlap must be True or False"):
        SharingSettings(overlap="yes")  # type: ignore[arg-type]
    settings = SharingSettings(ENCODER, overlap=False)
    assert SharingSettings.from_dict(settings.to_dict()) == settings
    assert ALGORITHMS["sharing"].from_settings(settings.to_dict()).settings == settings
