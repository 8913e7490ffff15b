"""Threshold policies, residual post-processors, shake-up and the per-step encoder."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.testing import assert_close

from torchspark.encoding import (
    AdaptiveThreshold,
    EncoderConfig,
    EncoderState,
    FixedThreshold,
    NoResidualPostProcessing,
    ResidualClipping,
    TargetSparsityThreshold,
    ThresholdState,
    average_states,
    decode,
    encode_step,
    residual_post_processor_from_dict,
    shake_up_threshold,
    threshold_encode,
    threshold_policy_from_dict,
)
from torchspark.errors import ConfigError

DECAY = 0.5 ** (1 / 20)


# --- pure policy rules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sparsity,factor",
    [(1e-5, DECAY), (0.0, DECAY), (1e-3, 1.0), (1e-4, 1.0), (1e-2, 1.0), (0.05, 1 / DECAY), (1 / 16, 1 / DECAY)],
)
def test_adaptive_rule(sparsity: float, factor: float) -> None:
    policy = AdaptiveThreshold(initial=1e-4)  # DL4J's start
    state = policy.next_threshold(policy.initial_state(), sparsity)
    assert state.threshold == pytest.approx(1e-4 * factor)
    assert state.last_sparsity == sparsity


@pytest.mark.parametrize("sparsity,factor", [(1e-4, DECAY), (1e-3, 1.0), (1e-2, 1 / DECAY)])
def test_target_sparsity_rule(sparsity: float, factor: float) -> None:
    policy = TargetSparsityThreshold(initial=1e-4)
    assert policy.next_threshold(policy.initial_state(), sparsity).threshold == pytest.approx(1e-4 * factor)


def test_fixed_and_bounds() -> None:
    assert FixedThreshold(0.5).next_threshold(ThresholdState(0.5), 0.9).threshold == 0.5
    policy = AdaptiveThreshold(initial=1e-9, min_threshold=1e-9)
    assert policy.next_threshold(policy.initial_state(), 0.0).threshold == 1e-9


def _simulate(policy: Any, steps: int = 700, n: int = 10_000) -> list[float]:
    """Sparsities over a fixed update stream: per-element scales, a slow random-walk drift plus fresh noise."""
    g = torch.Generator().manual_seed(0)
    direction = torch.randn(n, generator=g)
    scale = torch.exp(torch.randn(n, generator=g))  # heterogeneous magnitudes, like real layers
    state = EncoderState.create(EncoderConfig(threshold_policy=policy), n)
    sparsities = []
    for step in range(steps):
        direction += 0.1 * torch.randn(n, generator=g)
        update = 1e-3 * scale * (0.1 * direction + torch.randn(n, generator=g))
        msg, state = encode_step(update, state, step)
        sparsities.append(msg.density)
    return sparsities


@pytest.mark.parametrize("initial", [1.0, 1e-6])  # ~100x above and ~10^4x below the band's threshold
def test_adaptive_moves_into_band_and_stays(initial: float) -> None:
    sparsities = _simulate(AdaptiveThreshold(initial=initial, min_target_sparsity=1e-3, max_target_sparsity=1e-2))
    assert not 1e-3 <= sparsities[0] <= 1e-2  # it really had to move
    tail = sparsities[-150:]
    assert sum(1e-3 <= s <= 1e-2 for s in tail) >= 140, tail


def test_target_sparsity_converges() -> None:
    sparsities = _simulate(TargetSparsityThreshold(initial=1.0, target=3e-3))
    assert sparsities[0] == 0.0
    tail = sparsities[-150:]
    assert 1.5e-3 <= sum(tail) / len(tail) <= 6e-3, tail


def test_average_states_skips_workers_that_never_stepped() -> None:
    """DL4J's reducer adds only threshold algorithms that ran: the idle worker's 3.0 is left out of both means."""
    avg = average_states([ThresholdState(1.0, 0.1), ThresholdState(3.0, None), ThresholdState(2.0, 0.3)])
    assert avg.threshold == 1.5 and avg.last_sparsity == pytest.approx(0.2)
    none_stepped = average_states([ThresholdState(1.0), ThresholdState(3.0)])
    assert none_stepped.threshold == 2.0 and none_stepped.last_sparsity is None
    with pytest.raises(ConfigError):
        average_states([])


# --- config validation and serialisation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,value",
    [
        (lambda: FixedThreshold(0.0), "0.0"),
        (lambda: FixedThreshold(float("nan")), "nan"),
        (lambda: AdaptiveThreshold(initial=-1.0), "-1.0"),
        (lambda: AdaptiveThreshold(decay_rate=1.0), "1.0"),
        (lambda: AdaptiveThreshold(decay_rate=0.3), "0.3"),
        (lambda: AdaptiveThreshold(min_target_sparsity=0.1, max_target_sparsity=0.01), "0.1"),
        (lambda: TargetSparsityThreshold(target=0.1), "0.1"),
        (lambda: TargetSparsityThreshold(target=0.0), "0.0"),
        (lambda: AdaptiveThreshold(initial=1e-12), "1e-12"),
        (lambda: ResidualClipping(threshold_multiple=0.5), "0.5"),
        (lambda: ResidualClipping(frequency=0), "0"),
        (lambda: EncoderConfig(shake_frequency=-1), "-1"),
        (lambda: EncoderConfig(min_entries=0), "0"),
    ],
)
def test_invalid_configs_name_the_value(make: Any, value: str) -> None:
    with pytest.raises(ConfigError, match=value):
        make()


@pytest.mark.parametrize(
    "obj", [FixedThreshold(0.25), AdaptiveThreshold(initial=1e-3, decay_rate=0.9), TargetSparsityThreshold(target=1e-2)]
)
def test_policy_json_round_trip(obj: Any) -> None:
    assert threshold_policy_from_dict(json.loads(json.dumps(obj.to_dict()))) == obj


@pytest.mark.parametrize("obj", [ResidualClipping(2.0, 3), NoResidualPostProcessing()])
def test_post_processor_json_round_trip(obj: Any) -> None:
    assert residual_post_processor_from_dict(json.loads(json.dumps(obj.to_dict()))) == obj


def test_encoder_config_json_round_trip_and_unknown_types() -> None:
    config = EncoderConfig(TargetSparsityThreshold(), NoResidualPostProcessing(), shake_frequency=7, min_entries=2)
    assert EncoderConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ConfigError, match="'magic'.*adaptive"):
        threshold_policy_from_dict({"type": "magic"})
    with pytest.raises(ConfigError, match="'magic'.*clipping"):
        residual_post_processor_from_dict({"type": "magic"})
    with pytest.raises(ConfigError, match="bogus"):
        threshold_policy_from_dict({"type": "fixed", "bogus": 1})


# --- residual post-processing and shake-up ----------------------------------------------------------------------


def test_clipping_clips_at_the_right_steps_only() -> None:
    clip = ResidualClipping(threshold_multiple=2.0, frequency=5)
    clipped_steps = []
    for step in range(12):
        residual = torch.tensor([10.0, -10.0, 1.0])
        if clip.process(residual, 1.0, step):
            clipped_steps.append(step)
            assert residual.tolist() == [2.0, -2.0, 1.0]
        else:
            assert residual.tolist() == [10.0, -10.0, 1.0]
    assert clipped_steps == [5, 10]
    residual = torch.tensor([10.0])
    assert not NoResidualPostProcessing().process(residual, 1.0, 5) and residual.item() == 10.0


def test_shake_up_threshold_schedule() -> None:
    assert [shake_up_threshold(0.9, s, 3) for s in range(7)] == [0.9, 0.9, 0.9, 0.3, 0.9, 0.9, 0.3]
    assert shake_up_threshold(0.9, 6, 0) == 0.9


def test_shake_up_flushes_small_residuals() -> None:
    def run(shake_frequency: int) -> tuple[Any, EncoderState]:
        config = EncoderConfig(FixedThreshold(0.9), NoResidualPostProcessing(), shake_frequency=shake_frequency)
        state = EncoderState.create(config, 4)
        state.residual.copy_(torch.tensor([0.5, -0.5, 0.1, 0.0]))
        return encode_step(None, state, 3)

    plain, plain_state = run(0)
    assert plain.format == "empty" and plain_state.residual.tolist() == pytest.approx([0.5, -0.5, 0.1, 0.0])
    shaken, shaken_state = run(3)
    assert shaken.threshold == pytest.approx(0.3)
    assert decode(shaken, torch.zeros(4)).tolist() == pytest.approx([0.3, -0.3, 0.0, 0.0])
    assert shaken_state.residual.tolist() == pytest.approx([0.2, -0.2, 0.1, 0.0])
    assert shaken_state.threshold_state.threshold == 0.9


# --- the per-step encoder ----------------------------------------------------------------------------------------


def test_encode_step_nothing_lost_without_clipping() -> None:
    n = 500
    config = EncoderConfig(
        AdaptiveThreshold(initial=0.1, decay_rate=0.9), NoResidualPostProcessing(), shake_frequency=4
    )
    state = EncoderState.create(config, n)
    g = torch.Generator().manual_seed(1)
    total, decoded = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for step in range(200):
        update = torch.randn(n, generator=g) * 0.01
        total += update.double()
        msg, state = encode_step(update, state, step)
        decoded += decode(msg, torch.zeros(n)).double()
    assert_close(decoded + state.residual.double(), total, atol=1e-5, rtol=1e-5)


def test_encode_step_uses_and_advances_threshold_state() -> None:
    config = EncoderConfig(AdaptiveThreshold(initial=1.0, decay_rate=0.5), ResidualClipping())
    state = EncoderState.create(config, 100)
    msg, state2 = encode_step(torch.full((100,), 0.1), state, 0)
    assert msg.format == "empty" and msg.threshold == 1.0
    assert state2.threshold_state == ThresholdState(0.5, 0.0)
    assert state2.residual is state.residual


def test_encoder_state_save_and_resume(tmp_path: Any) -> None:
    config = EncoderConfig(AdaptiveThreshold(initial=0.05))
    g = torch.Generator().manual_seed(2)
    updates = [torch.randn(300, generator=g) * 0.03 for _ in range(10)]
    state = EncoderState.create(config, 300)
    for step in range(5):
        _, state = encode_step(updates[step], state, step)
    save_file(state.state_tensors(), str(tmp_path / "enc.safetensors"))
    resumed = EncoderState.load_state_tensors(config, load_file(str(tmp_path / "enc.safetensors")))
    assert resumed.threshold_state == state.threshold_state and resumed.residual.equal(state.residual)
    for step in range(5, 10):
        a, state = encode_step(updates[step], state, step)
        b, resumed = encode_step(updates[step], resumed, step)
        assert a.format == b.format and a.payload.equal(b.payload) and a.threshold == b.threshold
    assert ThresholdState.from_dict(json.loads(json.dumps(state.threshold_state.to_dict()))) == state.threshold_state


def test_encode_step_matches_plain_threshold_encode() -> None:
    """With a fixed threshold and no post-processing, the encoder is exactly the codec."""
    config = EncoderConfig(FixedThreshold(0.5), NoResidualPostProcessing())
    state = EncoderState.create(config, 64)
    residual = torch.zeros(64)
    g = torch.Generator().manual_seed(4)
    for step in range(20):
        update = torch.randn(64, generator=g) * 0.3
        a, state = encode_step(update, state, step)
        b = threshold_encode(update, residual, 0.5)
        assert a.payload.equal(b.payload)
    assert state.residual.equal(residual)


def test_encoder_config_boundary_caps_every_step_and_round_trips() -> None:
    config = EncoderConfig(
        threshold_policy=FixedThreshold(1.0), residual_post_processor=NoResidualPostProcessing(), boundary=3
    )
    assert EncoderConfig.from_dict(config.to_dict()) == config
    state = EncoderState.create(config, 10)
    sent = []
    for step in range(4):
        message, state = encode_step(torch.ones(10) if step == 0 else None, state, step)
        sent.append(message.num_entries)
    assert sent == [3, 3, 3, 1]  # ten entries leave three at a time; nothing is lost
    assert float(state.residual.abs().sum()) == 0.0
    with pytest.raises(ConfigError, match="boundary"):
        EncoderConfig(boundary=0)
