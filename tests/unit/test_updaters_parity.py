"""DL4J-parity updaters against a few-line torch loop: L1, AMSGrad, Nesterov, learning-rate schedules (formulas,
JSON, save/load, the rate actually applied per step, on workers too)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import torch

from helpers import fit_in_process, mlp_net, uniform_batches
from torchspark import models, optim
from torchspark.data import DataSet
from torchspark.errors import ConfigError
from torchspark.nn import Network
from torchspark.schedules import (
    ExponentialSchedule,
    InverseSchedule,
    MapSchedule,
    PolySchedule,
    Schedule,
    SigmoidSchedule,
    StepSchedule,
    schedule_from_dict,
)

BATCH = 16


_batches = partial(uniform_batches, size=BATCH)


def _net(updater: optim.UpdaterSpec, **kwargs: Any) -> Network:
    return mlp_net(64, 16, 10, updater=updater, **kwargs)


def _torch_loop(
    net: Network,
    batches: list[DataSet],
    make_opt: Callable[[list[torch.nn.Parameter]], Any],
    lr_at: Callable[[int], float] | None = None,
    l1: float = 0.0,
) -> torch.Tensor:
    """The reference: a plain torch module with the (untrained) network's weights, trained step by step."""
    assert net.iteration == 0, "build the reference from the untrained network"
    module = models.mlp(64, 16, 10)
    module.load_state_dict(net.module.state_dict())
    params = list(module.parameters())
    opt = make_opt(params)
    for i, batch in enumerate(batches):
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(i)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(module(batch.features), batch.labels)
        if l1:
            loss = loss + l1 * sum(p.abs().sum() for p in params)
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in params])


def _trained(net: Network, batches: list[DataSet]) -> torch.Tensor:
    for batch in batches:
        net.train_step(batch)
    return net.params()


# ------------------------------------------------------------------------------------------------ L1, AMSGrad, Nesterov
@pytest.mark.parametrize(
    "spec,torch_opt",
    [
        (optim.SGD(lr=0.1, fused=False), lambda ps: torch.optim.SGD(ps, lr=0.1)),
        (optim.Adam(lr=1e-2, fused=False), lambda ps: torch.optim.Adam(ps, lr=1e-2)),
    ],
    ids=["sgd", "adam"],
)
def test_l1_equals_torch_loop_with_l1_penalty_in_the_loss(spec: optim.UpdaterSpec, torch_opt: Any) -> None:
    batches = _batches(15)
    net = _net(spec, l1=1e-3)
    expected = _torch_loop(net, batches, torch_opt, l1=1e-3)
    got = _trained(net, batches)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    without = _trained(_net(spec), batches)
    assert not torch.allclose(got, without, atol=1e-5), "l1 must change the trajectory"


def test_l1_drives_small_weights_to_zero_with_sgd_and_is_validated() -> None:
    net = _net(optim.SGD(lr=0.1), l1=0.05)
    start = net.params().abs().sum()
    _trained(net, _batches(30))
    assert net.params().abs().sum() < 0.5 * start
    for bad in (-1.0, math.inf, True):
        with pytest.raises(ConfigError, match="l1 must be"):
            _net(optim.SGD(), l1=bad)


@pytest.mark.parametrize("cls,torch_cls", [(optim.Adam, torch.optim.Adam), (optim.AdamW, torch.optim.AdamW)])
def test_amsgrad_equals_torch_amsgrad(cls: type[optim.Adam], torch_cls: Any) -> None:
    batches = _batches(20)
    net = _net(cls(lr=1e-2, amsgrad=True, fused=False))
    expected = _torch_loop(net, batches, lambda ps: torch_cls(ps, lr=1e-2, amsgrad=True, weight_decay=0.0))
    got = _trained(net, batches)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    fused = _trained(_net(cls(lr=1e-2, amsgrad=True)), batches)  # the fused kernel runs AMSGrad too
    torch.testing.assert_close(fused, expected, rtol=1e-4, atol=1e-5)
    plain = _trained(_net(cls(lr=1e-2, fused=False)), batches)
    assert not torch.allclose(got, plain, atol=1e-5), "amsgrad must change the trajectory"
    # max_exp_avg_sq joins exp_avg and exp_avg_sq in the updater state that averaging and save/load carry
    assert net.updater_state_size() - _net(cls(fused=False)).updater_state_size() == net.num_params()
    with pytest.raises(ConfigError, match="amsgrad"):
        cls(amsgrad="yes")  # type: ignore[arg-type]


def test_nesterov_equals_torch_nesterov() -> None:
    batches = _batches(20)
    net = _net(optim.SGD(lr=0.05, momentum=0.9, nesterov=True, fused=False))
    expected = _torch_loop(net, batches, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True))
    got = _trained(net, batches)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    plain = _trained(_net(optim.SGD(lr=0.05, momentum=0.9, fused=False)), batches)
    assert not torch.allclose(got, plain, atol=1e-5), "nesterov must change the trajectory"


def test_nesterov_matches_dl4j_nesterovs_update_rule() -> None:
    """DL4J's Nesterovs updater: v' = mu v - lr g; params += -mu v + (1 + mu) v' (a different bookkeeping)."""
    batches = _batches(10)
    net = _net(optim.SGD(lr=0.05, momentum=0.9, nesterov=True, fused=False))
    module = models.mlp(64, 16, 10)
    module.load_state_dict(net.module.state_dict())
    velocity = [torch.zeros_like(p) for p in module.parameters()]
    for batch in batches:
        module.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(module(batch.features), batch.labels).backward()
        with torch.no_grad():
            for p, v in zip(module.parameters(), velocity):
                previous = v.clone()
                v.mul_(0.9).sub_(0.05 * p.grad)
                p.add_(-0.9 * previous + 1.9 * v)
    expected = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    torch.testing.assert_close(_trained(net, batches), expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------- schedules
# (schedule, DL4J's formula at t)
FORMULAS: list[tuple[Schedule, Callable[[int], float]]] = [
    (StepSchedule(0.1, decay_rate=0.5, step=3), lambda t: 0.1 * 0.5 ** math.floor(t / 3)),
    (ExponentialSchedule(0.1, gamma=0.9), lambda t: 0.1 * 0.9**t),
    (InverseSchedule(0.1, gamma=0.2, power=0.75), lambda t: 0.1 / (1 + 0.2 * t) ** 0.75),
    (PolySchedule(0.1, power=2.0, max_iter=8), lambda t: 0.1 * (1 - t / 8) ** 2 if t <= 8 else 0.0),
    (SigmoidSchedule(0.1, gamma=-0.8, step_size=5), lambda t: 0.1 / (1 + math.exp(0.8 * (t - 5)))),
    (MapSchedule({0: 0.1, 4: 0.03, 9: 0.005}), lambda t: 0.1 if t < 4 else 0.03 if t < 9 else 0.005),
]


@pytest.mark.parametrize("schedule,formula", FORMULAS, ids=lambda v: getattr(v, "name", ""))
def test_schedule_values_and_json(schedule: Schedule, formula: Callable[[int], float]) -> None:
    for t in range(14):
        assert schedule.value(t, 99) == pytest.approx(formula(t)), t
    by_epoch = replace(schedule, unit="epoch")
    assert [by_epoch.value(99, e) for e in range(6)] == pytest.approx([formula(e) for e in range(6)])
    again = schedule_from_dict(json.loads(json.dumps(schedule.to_dict())))
    assert again == schedule and again.value(7, 0) == schedule.value(7, 0)


def test_schedules_are_validated() -> None:
    with pytest.raises(ConfigError, match="include 0"):
        MapSchedule({5: 0.1})
    with pytest.raises(ConfigError, match="unit must be"):
        StepSchedule(0.1, 0.5, 10, unit="batch")
    with pytest.raises(ConfigError, match="initial"):
        ExponentialSchedule(0.0, gamma=0.9)
    with pytest.raises(ConfigError, match="max_iter"):
        PolySchedule(0.1, power=1.0, max_iter=0)
    with pytest.raises(ConfigError, match="unknown schedule"):
        schedule_from_dict({"type": "triangular"})
    with pytest.raises(ConfigError, match="lr must be"):
        optim.SGD(lr=-1.0)


@pytest.mark.parametrize("schedule,formula", FORMULAS, ids=lambda v: getattr(v, "name", ""))
def test_scheduled_lr_is_applied_every_iteration(schedule: Schedule, formula: Callable[[int], float]) -> None:
    batches = _batches(12)
    net = _net(optim.SGD(lr=schedule, fused=False))
    expected = _torch_loop(net, batches, lambda ps: torch.optim.SGD(ps, lr=1.0), lr_at=formula)
    applied = []
    for batch in batches:
        applied.append(net.current_lr())
        net.train_step(batch)
        assert net.optimizer.param_groups[0]["lr"] == pytest.approx(applied[-1])
    assert applied == pytest.approx([formula(t) for t in range(12)])
    torch.testing.assert_close(net.params(), expected, rtol=1e-5, atol=1e-6)
    fixed = _trained(_net(optim.SGD(lr=formula(0), fused=False)), batches)
    assert not torch.allclose(net.params(), fixed, atol=1e-6), "the schedule must change the trajectory"


def test_epoch_schedule_changes_lr_once_per_epoch_in_fit() -> None:
    batches = _batches(4)
    schedule = MapSchedule({0: 0.1, 1: 0.02, 2: 0.5}, unit="epoch")
    net = _net(optim.Adam(lr=schedule, fused=False))
    expected = _torch_loop(
        net, batches * 3, lambda ps: torch.optim.Adam(ps, lr=1.0), lr_at=lambda i: [0.1, 0.02, 0.5][i // 4]
    )
    net.fit(batches, epochs=3)
    torch.testing.assert_close(net.params(), expected, rtol=1e-5, atol=1e-6)


def test_schedule_l1_amsgrad_survive_save_load_and_continue(tmp_path: Any) -> None:
    spec = optim.Adam(lr=StepSchedule(0.05, decay_rate=0.3, step=4), amsgrad=True, fused=False)
    batches = _batches(10)
    net = _net(spec, l1=1e-3)
    _trained(net, batches[:5])
    net.save(str(tmp_path / "model"))
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["updater"]["lr"] == {
        "type": "step",
        "initial": 0.05,
        "decay_rate": 0.3,
        "step": 4,
        "unit": "iteration",
    }
    assert config["l1"] == 1e-3 and config["updater"]["amsgrad"] is True
    loaded = Network.load(str(tmp_path / "model"))
    assert loaded.updater == spec and loaded.l1 == 1e-3 and loaded.iteration == 5
    assert loaded.current_lr() == pytest.approx(0.05 * 0.3)  # iteration 5: one decay step
    torch.testing.assert_close(_trained(loaded, batches[5:]), _trained(net, batches[5:]))


def test_schedule_and_l1_travel_to_in_process_workers() -> None:
    """Two workers on identical shards, averaging every step: equal to one torch loop with the scheduled rate."""
    schedule = MapSchedule({0: 0.2, 3: 0.05, 6: 0.01})
    net = _net(optim.SGD(lr=schedule, fused=False), l1=1e-3)
    batches = _batches(8)
    reference = _torch_loop(
        net, batches, lambda ps: torch.optim.SGD(ps, lr=1.0), l1=1e-3, lr_at=lambda i: schedule.value(i, 0)
    )
    fit_in_process(
        net, "averaging", {"averaging_frequency": 1, "save_updater": True}, [batches, batches], timeout_s=60.0
    )
    assert net.iteration == 8 and net.current_lr() == pytest.approx(0.01)
    torch.testing.assert_close(net.params(), reference, rtol=1e-5, atol=1e-6)
