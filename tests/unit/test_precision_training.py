"""Mixed precision in distributed training, workers as threads of this process: both algorithms train at the
network's precision (the blueprint carries it), gradient sharing's hot paths included, and fp16's scaler state
survives a checkpoint resume and comes back to the driver's network."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from helpers import assert_replicas_identical, classification_batches, fit_in_process, mlp_net, onehot_rule_data
from interrupting import InterruptingMLP
from reference_loops import averaging_reference, sharing_reference
from torchspark import Network, optim
from torchspark.encoding import AdaptiveThreshold, EncoderConfig
from torchspark.errors import WorkerError
from torchspark.nn.precision import SCALER_KEYS
from torchspark.parallel import ParallelWrapper
from torchspark.training import InProcessRunner
from torchspark.training.algorithms.sharing.fused import can_step_into
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.checkpoint import newest_checkpoint, store

ENCODER = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3), shake_frequency=4)
SHARDS = [classification_batches(6, seed=1), classification_batches(6, seed=2)]


@pytest.mark.parametrize("options", [{}, {"weight_decay": 1e-3}], ids=["step_into_residual", "accumulate_step"])
@pytest.mark.parametrize("overlap", [True, False])
def test_sharing_trains_at_the_networks_precision_as_the_reference_loop_does(options, overlap) -> None:
    """Both hot paths of the fused step (the updater steps into the residual; one step moved into it) with bf16:
    the fit equals the single-process reference of the bf16 network and differs from the fp32 one."""
    net = partial(mlp_net, 12, 16, 3, updater=optim.SGD(lr=0.1, momentum=0.9), **options)
    bf16 = net(precision="bf16")
    assert can_step_into(bf16) == (not options)
    expected, _ = sharing_reference(bf16, SHARDS, 2, overlap, ENCODER)
    fp32, _ = sharing_reference(net(), SHARDS, 2, overlap, ENCODER)
    results = fit_in_process(bf16, "sharing", SharingSettings(ENCODER, overlap=overlap).to_dict(), SHARDS, epochs=2)
    torch.testing.assert_close(bf16.params(), expected[0].params(), rtol=0, atol=0)
    assert not torch.allclose(bf16.params(), fp32[0].params(), atol=1e-5)
    assert_replicas_identical(results, 2, net=bf16)


def test_averaging_trains_at_the_networks_precision_as_the_reference_loop_does() -> None:
    net = partial(mlp_net, 12, 16, 3, updater=optim.Adam(lr=1e-2))
    bf16 = net(precision="bf16")
    expected = averaging_reference(bf16, SHARDS, epochs=2, frequency=2, save_updater=True)
    fp32 = averaging_reference(net(), SHARDS, epochs=2, frequency=2, save_updater=True)
    fit_in_process(bf16, "averaging", {"averaging_frequency": 2, "save_updater": True}, SHARDS, epochs=2)
    torch.testing.assert_close(bf16.params(), expected.params(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(bf16.params(), fp32.params(), atol=1e-4)


def _scaler(net: Network) -> tuple[float, int]:
    state = net.amp.state_tensors()
    return float(state[SCALER_KEYS[0]]), int(state[SCALER_KEYS[1]])


def _fp16(after: int | None = None) -> Network:
    net = Network(
        InterruptingMLP(12, 16, 3, after=after, same_process=True),
        updater=optim.Adam(lr=0.01),
        seed=0,
        precision="fp16",
    )
    # a start scale too large for fp16's gradients: the first steps of every worker are skipped and back it off
    net.amp.load_state_tensors({SCALER_KEYS[0]: torch.tensor([2.0**24]), SCALER_KEYS[1]: torch.tensor([0])})
    return net


def _wrapper(net: Network, mode: str, **options) -> ParallelWrapper:
    extra = {"averaging_frequency": 3} if mode == "averaging" else {}
    return ParallelWrapper(
        net, num_workers=2, training_mode=mode, progress=False, runner=InProcessRunner(timeout_s=60), **extra, **options
    )


@pytest.mark.parametrize("mode", ["averaging", "sharing"])
def test_fp16_scaler_state_is_checkpointed_and_a_resumed_fit_ends_where_an_uninterrupted_one_does(
    tmp_path, mode
) -> None:
    data, epochs = onehot_rule_data(192, seed=3), 3
    reference = _fp16()
    _wrapper(reference, mode).fit(data, epochs=epochs, batch_size=16)
    scale, tracker = _scaler(reference)
    assert scale < 2.0**24 and tracker > 0, "steps were skipped, then taken"

    options = dict(checkpoint_directory=str(tmp_path), checkpoint_every=2)
    with pytest.raises(WorkerError, match="worker stopped after 16 minibatches"):
        _wrapper(_fp16(after=16), mode, **options).fit(data, epochs=epochs, batch_size=16, run_id="r1")
    cut = newest_checkpoint(str(tmp_path), "r1")
    tensors, meta = store.read_rank_file(cut.path, 1)
    assert set(SCALER_KEYS) <= set(tensors)  # every rank saves its own scaler
    done = meta["done"]
    resumed = _fp16(after=6 - done)
    _wrapper(resumed, mode, **options).fit(data, epochs=epochs, batch_size=16, run_id="r1")
    assert _scaler(resumed) == (scale, tracker)
    torch.testing.assert_close(resumed.params(), reference.params(), rtol=0, atol=1e-6)
    torch.testing.assert_close(resumed.updater_state(), reference.updater_state(), rtol=0, atol=1e-6)


def test_a_skipped_fp16_step_leaves_the_sharing_residual_alone_and_a_taken_one_fills_it() -> None:
    from torchspark.training.algorithms.sharing.fused import train_step_into

    net = mlp_net(12, 16, 3, updater=optim.SGD(lr=0.1), precision="fp16")
    batch = classification_batches(1, seed=5, size=16)[0]
    residual = torch.zeros(net.num_params())
    net.amp.load_state_tensors({SCALER_KEYS[0]: torch.tensor([2.0**40]), SCALER_KEYS[1]: torch.tensor([0])})
    params = net.params()
    train_step_into(net, residual, batch)
    assert not residual.any() and torch.equal(net.params(), params) and net.amp.skipped_steps == 1
    net.amp.load_state_tensors({SCALER_KEYS[0]: torch.tensor([256.0]), SCALER_KEYS[1]: torch.tensor([0])})
    expected = net.copy().compute_update(batch)
    train_step_into(net, residual, batch)
    torch.testing.assert_close(residual, expected, rtol=1e-6, atol=1e-7)
    assert torch.equal(net.params(), params) and residual.dtype == torch.float32 and net.iteration == 2
