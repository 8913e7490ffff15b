"""Calibrated start threshold: the pure calibration function, the agreement, the policies' state, encode_step."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch

from torchspark.encoding import (
    CALIBRATED,
    AdaptiveThreshold,
    EncoderConfig,
    EncoderState,
    FixedThreshold,
    NoResidualPostProcessing,
    TargetSparsityThreshold,
    ThresholdState,
    agree_threshold,
    average_states,
    calibrated_threshold,
    encode_step,
    local_calibration,
    threshold_policy_from_dict,
    with_calibration,
)
from torchspark.errors import ConfigError


def _model_sparsity(update: torch.Tensor, t: float) -> float:
    """The calibration model's sparsity at threshold t: mean over entries of min(1, (|u|/t)^2)."""
    a = update.double().abs()
    return float(torch.clamp((a / t) ** 2, max=1.0).mean())


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


UPDATES = {
    # Adam's first step: every entry is +-lr (entries with a zero gradient stay 0)
    "adam_first_step": lambda: 1e-3 * torch.sign(torch.randn(50_000, generator=_gen(0))),
    "sgd_gaussian": lambda: 0.1 * torch.randn(50_000, generator=_gen(1)),
    "heavy_tailed": lambda: (
        1e-2 * torch.randn(50_000, generator=_gen(2)) * torch.exp(2 * torch.randn(50_000, generator=_gen(3)))
    ),
    "half_zero": lambda: torch.where(
        torch.arange(50_000) % 2 == 0, torch.zeros(50_000), 1e-3 * torch.randn(50_000, generator=_gen(4))
    ),
}


@pytest.mark.parametrize("target", [1e-4, 1e-3, 1e-2])
@pytest.mark.parametrize("kind", sorted(UPDATES))
def test_calibrated_threshold_solves_the_model_equation(kind: str, target: float) -> None:
    update = UPDATES[kind]()
    t = calibrated_threshold(update, target)
    assert t is not None and t > 0
    assert _model_sparsity(update, t) == pytest.approx(target, rel=1e-6)


@pytest.mark.parametrize("fraction,target", [(1.0, 1e-3), (0.25, 1e-3), (1.0, 4e-2)])
def test_equal_magnitudes_give_the_closed_form(fraction: float, target: float) -> None:
    # n * fraction entries of size a: fraction * (a/t)^2 = target  ->  t = a * sqrt(fraction / target)
    n, a = 40_000, 1e-3
    update = torch.zeros(n)
    update[: int(n * fraction)] = a
    assert calibrated_threshold(update, target) == pytest.approx(a * math.sqrt(fraction / target), rel=1e-6)


@pytest.mark.parametrize("scale", [1e-6, 3.0, 1e4])
def test_calibration_scales_with_the_update(scale: float) -> None:
    update = UPDATES["heavy_tailed"]()
    assert calibrated_threshold(scale * update, 1e-3) == pytest.approx(
        scale * calibrated_threshold(update, 1e-3), rel=1e-5
    )


def test_a_sparser_target_gives_a_larger_threshold() -> None:
    update = UPDATES["sgd_gaussian"]()
    values = [calibrated_threshold(update, target) for target in (1e-2, 1e-3, 1e-4)]
    assert values[0] < values[1] < values[2]


@pytest.mark.parametrize(
    "update,expected",
    [
        (torch.zeros(100), None),
        (torch.full((100,), float("nan")), None),
        (torch.tensor([float("inf"), 0.0, 0.0]), None),
        # 2 non-zero entries in 10,000 is sparser than 1e-3 already: send every non-zero entry
        (torch.cat([torch.tensor([0.5, -0.2]), torch.zeros(9_998)]), 0.2),
    ],
)
def test_degenerate_updates(update: torch.Tensor, expected: float | None) -> None:
    got = calibrated_threshold(update, 1e-3)
    assert got == (None if expected is None else pytest.approx(expected))


def test_a_strided_sample_is_close_to_the_full_answer() -> None:
    update = UPDATES["heavy_tailed"]().repeat(8)  # 400,000 entries
    full = calibrated_threshold(update, 1e-3)
    sampled = calibrated_threshold(update, 1e-3, max_samples=30_000)
    assert sampled == pytest.approx(full, rel=0.1) and sampled != full


def test_calibration_accepts_any_shape_and_does_not_touch_the_update() -> None:
    update = UPDATES["sgd_gaussian"]()
    before = update.clone()
    assert calibrated_threshold(update.reshape(100, 500), 1e-3) == calibrated_threshold(update, 1e-3)
    assert torch.equal(update, before)


@pytest.mark.parametrize(
    "kwargs,value",
    [
        ({"target_sparsity": 0.0}, "0.0"),
        ({"target_sparsity": 1.0}, "1.0"),
        ({"target_sparsity": 1e-3, "max_samples": 0}, "0"),
    ],
)
def test_bad_calibration_arguments_name_the_value(kwargs: dict[str, Any], value: str) -> None:
    with pytest.raises(ConfigError, match=value):
        calibrated_threshold(torch.ones(10), **kwargs)


# --- agreement -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values,expected",
    [
        ([0.01, 0.04], 0.02),  # geometric mean
        ([0.01, None, 0.04], 0.02),  # a worker without data does not vote
        ([0.01, float("nan"), 0.04, 0.0], 0.02),  # nor does a NaN (gathered "no value") or a non-positive value
        ([0.03], 0.03),
        ([None, float("nan")], None),
        ([], None),
    ],
)
def test_agree_threshold(values: list[float | None], expected: float | None) -> None:
    got = agree_threshold(values)
    assert got == (None if expected is None else pytest.approx(expected))


# --- policies and state ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy,target",
    [
        (AdaptiveThreshold(), 1e-3),  # the middle (geometric) of the default band [1e-4, 1e-2]
        (AdaptiveThreshold(min_target_sparsity=1e-3, max_target_sparsity=4e-3), 2e-3),
        (TargetSparsityThreshold(), 1e-3),
        (TargetSparsityThreshold(target=5e-3), 5e-3),
        (AdaptiveThreshold(initial=1e-4), None),  # DL4J's fixed start: no calibration
        (TargetSparsityThreshold(initial=1e-4), None),
        (FixedThreshold(0.5), None),
    ],
)
def test_calibration_target_and_initial_state(policy: Any, target: float | None) -> None:
    got = policy.calibration_target()
    assert got == (None if target is None else pytest.approx(target))
    state = policy.initial_state()
    assert state.calibrated is (target is None)
    if target is None:
        assert state.threshold == getattr(policy, "initial", getattr(policy, "threshold", None))


def test_calibrated_is_the_default_start() -> None:
    assert AdaptiveThreshold().initial == CALIBRATED == TargetSparsityThreshold().initial
    assert EncoderConfig().threshold_policy.calibration_target() is not None


@pytest.mark.parametrize("threshold,expected", [(0.02, 0.02), (1e-12, 1e-6), (5.0, 1.0)])
def test_calibrated_state_is_clamped_to_the_bounds(threshold: float, expected: float) -> None:
    policy = AdaptiveThreshold(min_threshold=1e-6, max_threshold=1.0)
    assert policy.calibrated_state(threshold) == ThresholdState(expected)
    assert FixedThreshold(0.5).calibrated_state(threshold) == ThresholdState(0.5)


@pytest.mark.parametrize("policy", [AdaptiveThreshold(), TargetSparsityThreshold()])
def test_an_uncalibrated_state_cannot_be_stepped(policy: Any) -> None:
    with pytest.raises(ConfigError, match="not calibrated"):
        policy.next_threshold(policy.initial_state(), 1e-3)


@pytest.mark.parametrize(
    "make,value",
    [
        (lambda: AdaptiveThreshold(initial="auto"), "auto"),
        (lambda: TargetSparsityThreshold(initial=True), "True"),
        (lambda: AdaptiveThreshold(min_threshold=1.0, max_threshold=0.5), "0.5"),
    ],
)
def test_bad_initial_values_name_the_value(make: Any, value: str) -> None:
    with pytest.raises(ConfigError, match=value):
        make()


@pytest.mark.parametrize("policy", [AdaptiveThreshold(), TargetSparsityThreshold(target=2e-3)])
def test_calibrated_policies_round_trip_through_json(policy: Any) -> None:
    assert threshold_policy_from_dict(json.loads(json.dumps(policy.to_dict()))) == policy


def test_uncalibrated_state_round_trips_and_averages() -> None:
    state = ThresholdState(None)
    assert ThresholdState.from_tensor(state.to_tensor()) == state
    assert ThresholdState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert average_states(
        [ThresholdState(None), ThresholdState(0.2, 1e-3), ThresholdState(0.4, 3e-3)]
    ) == ThresholdState(pytest.approx(0.3), pytest.approx(2e-3))
    assert average_states([ThresholdState(None)]) == ThresholdState(None)


# --- encode_step -----------------------------------------------------------------------------------------------


def _config(policy: Any) -> EncoderConfig:
    return EncoderConfig(threshold_policy=policy, residual_post_processor=NoResidualPostProcessing())


def test_encode_step_calibrates_from_the_first_update_alone() -> None:
    update = UPDATES["sgd_gaussian"]()
    policy = AdaptiveThreshold()
    state = EncoderState.create(_config(policy), update.numel())
    expected = calibrated_threshold(update, policy.calibration_target())
    assert local_calibration(update, state) == expected
    message, state = encode_step(update, state, 0)
    assert message.threshold == float(np.float32(expected))
    assert state.threshold_state.threshold is not None
    assert local_calibration(update, state) is None  # calibrated once, never again


def test_encode_step_waits_for_an_update_to_calibrate_from() -> None:
    state = EncoderState.create(_config(AdaptiveThreshold()), 5)
    message, state = encode_step(torch.zeros(5), state, 0)
    assert message.format == "empty" and not state.threshold_state.calibrated
    message, state = encode_step(None, state, 1)
    assert message.format == "empty" and not state.threshold_state.calibrated
    update = torch.tensor([1.0, 0, 0, 0, 0])
    message, state = encode_step(update, state, 2)
    assert message.threshold == pytest.approx(calibrated_threshold(update, 1e-3), rel=1e-6)
    assert state.threshold_state.calibrated


def test_with_calibration_sets_the_agreed_value_once() -> None:
    state = EncoderState.create(_config(AdaptiveThreshold()), 5)
    assert with_calibration(state, None) is state
    agreed = with_calibration(state, 0.25)
    assert agreed.threshold_state == ThresholdState(0.25)
    assert with_calibration(agreed, 0.5) is agreed  # a calibrated state keeps its threshold
    fixed_start = EncoderState.create(_config(AdaptiveThreshold(initial=1e-4)), 5)
    assert with_calibration(fixed_start, 0.25).threshold_state == ThresholdState(1e-4)
    assert local_calibration(torch.ones(5), fixed_start) is None
