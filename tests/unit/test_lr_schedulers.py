"""torch.optim optimizer factories, torch.optim.lr_scheduler factories and the cosine / warm-up / one-cycle
schedules: each step's learning rate and the parameters equal a plain PyTorch loop, and the schedule's position
survives copies, save/load and counters that go back."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch
from torch.optim import lr_scheduler as L

from torchspark import DataSet, Network, models, optim
from torchspark.errors import ConfigError
from torchspark.schedules import CosineSchedule, OneCycleSchedule, StepSchedule, WarmupSchedule, schedule_from_dict

BATCH = 16


def _data() -> DataSet:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return DataSet(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def _module() -> torch.nn.Module:
    torch.manual_seed(1)
    return models.mlp(4, 8, 3)


def _torch_loop(make_opt, make_sched, epochs: int, interval: str = "step") -> tuple[list[float], torch.Tensor]:
    """The plain PyTorch loop: the lr of every step, and the final parameters."""
    data = _data()
    module = _module()
    opt = make_opt(list(module.parameters()))
    sched = make_sched(opt) if make_sched is not None else None
    lrs = []
    for _ in range(epochs):
        for i in range(0, len(data), BATCH):
            lrs.append(opt.param_groups[0]["lr"])
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(data.features[i : i + BATCH]), data.labels[i : i + BATCH])
            loss.backward()
            opt.step()
            if sched is not None and interval == "step":
                sched.step()
        if sched is not None and interval == "epoch":
            sched.step()
    return lrs, torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def _network_steps(net: Network, epochs: int) -> list[float]:
    data = _data()
    lrs = []
    for _ in range(epochs):
        for i in range(0, len(data), BATCH):
            lrs.append(net.current_lr())
            net.train_step(data.slice(i, i + BATCH))
        net.epoch += 1
    return lrs


SGD = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)
COSINE = functools.partial(L.CosineAnnealingLR, T_max=6)


def test_a_torch_cosine_scheduler_gives_the_plain_loops_learning_rates_and_parameters() -> None:
    want_lrs, want = _torch_loop(SGD, COSINE, epochs=2)
    net = Network(_module(), updater=SGD, lr_scheduler=lambda opt: L.CosineAnnealingLR(opt, T_max=6))
    lrs = _network_steps(net, epochs=2)
    assert lrs == want_lrs
    assert len(set(lrs)) > 4  # the schedule moved (and past T_max cosine climbs again, as PyTorch's does)
    assert torch.equal(net.params(), want)


def test_an_epoch_interval_steps_the_scheduler_once_per_epoch_of_fit() -> None:
    step_lr = functools.partial(L.StepLR, step_size=1, gamma=0.5)
    want_lrs, want = _torch_loop(SGD, step_lr, epochs=3, interval="epoch")
    net = Network(_module(), updater=SGD, lr_scheduler=step_lr, lr_scheduler_interval="epoch")
    net.fit(_data(), epochs=3, batch_size=BATCH)
    assert torch.equal(net.params(), want)
    assert net.current_lr() == pytest.approx(0.1 * 0.5**3)
    assert want_lrs[0] == 0.1 and want_lrs[-1] == pytest.approx(0.025)


@pytest.mark.parametrize("name", ["NAdam", "ASGD", "Rprop", "Adam", "RAdam", "Adadelta"])
def test_any_torch_optim_optimizer_factory_trains_as_the_plain_loop(name: str) -> None:
    """NAdam, ASGD and Rprop start their state away from zero (mu_product 1, eta = lr, step sizes = lr)."""
    factory = functools.partial(getattr(torch.optim, name), lr=0.01)
    _, want = _torch_loop(factory, None, epochs=2)
    net = Network(_module(), updater=factory)
    _network_steps(net, epochs=2)
    assert torch.equal(net.params(), want)
    before = Network(_module(), updater=factory).updater_state()
    net.reset_updater_state()  # what averaging without the updater state does after each round
    assert torch.equal(net.updater_state(), before)


def test_a_copy_and_a_saved_network_continue_the_schedule_where_it_stopped(tmp_path) -> None:
    """A partial of a torch scheduler class saves as JSON with its state_dict; a lambda travels in a copy."""
    want_lrs, want = _torch_loop(SGD, COSINE, epochs=2)
    net = Network(_module(), updater=SGD, lr_scheduler=COSINE)
    data = _data()
    for i in range(0, 48, BATCH):  # three steps
        net.train_step(data.slice(i, i + BATCH))
    net.save(str(tmp_path / "m"))
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["updater"] == {"type": "torch", "optimizer": "SGD", "kwargs": {"lr": 0.1, "momentum": 0.9}}
    assert config["lr_scheduler"] == {"torch": "CosineAnnealingLR", "kwargs": {"T_max": 6}}
    assert config["lr_scheduler_state"]["scheduler"]["last_epoch"] == 3
    loaded = Network.load(str(tmp_path / "m"))
    lam = Network(_module(), updater=SGD, lr_scheduler=lambda opt: L.CosineAnnealingLR(opt, T_max=6))
    lam.set_params(net.params())
    lam.set_updater_state(net.updater_state())
    lam.iteration = 3  # as a checkpoint restores the counters: the scheduler is replayed to them
    for other in (loaded, net.copy(), lam):
        assert other.iteration == 3 and other.current_lr() == want_lrs[3]
        rest = DataSet(data.features[48:], data.labels[48:])
        other.train_step(rest)
        other.epoch += 1
        lrs = _network_steps(other, epochs=1)
        assert lrs == want_lrs[4:]
        assert torch.equal(other.params(), want)


def test_counters_set_back_rebuild_the_scheduler_from_its_start() -> None:
    net = Network(_module(), updater=SGD, lr_scheduler=COSINE)
    first = net.current_lr()
    _network_steps(net, epochs=1)
    assert net.current_lr() != first
    net.iteration = 0  # a fit restored after a failure
    assert net.current_lr() == first
    net.iteration = 2
    assert net.current_lr() == pytest.approx(0.1 * (1 + math.cos(math.pi * 2 / 6)) / 2)


def test_a_schedule_as_lr_scheduler_drives_a_torch_optimizer_factory(tmp_path) -> None:
    schedule = WarmupSchedule(2, then=CosineSchedule(0.1, t_max=4))
    net = Network(models.mlp(4, 8, 3), updater=functools.partial(torch.optim.AdamW, lr=0.5), lr_scheduler=schedule)
    lrs = _network_steps(net, epochs=2)
    assert lrs == [schedule.value(t, 0) for t in range(8)]
    net.save(str(tmp_path / "m"))
    loaded = Network.load(str(tmp_path / "m"))
    assert loaded.lr_scheduler == schedule and loaded.current_lr() == schedule.value(8, 0)


def _torch_lrs(make_sched, steps: int, lr: float) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make_sched(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(
    ("schedule", "reference", "steps", "lr"),
    [
        (CosineSchedule(0.1, t_max=10), lambda o: L.CosineAnnealingLR(o, T_max=10), 11, 0.1),
        (CosineSchedule(0.1, t_max=7, eta_min=0.01), lambda o: L.CosineAnnealingLR(o, 7, eta_min=0.01), 8, 0.1),
        (
            WarmupSchedule(4, then=CosineSchedule(0.2, t_max=6), start_factor=0.25),
            lambda o: L.SequentialLR(
                o, [L.LinearLR(o, start_factor=0.25, total_iters=4), L.CosineAnnealingLR(o, T_max=6)], milestones=[4]
            ),
            11,
            0.2,
        ),
        (WarmupSchedule(3, then=0.2, start_factor=0.5), lambda o: L.LinearLR(o, 0.5, total_iters=3), 6, 0.2),
        (OneCycleSchedule(1.0, total_steps=20), lambda o: L.OneCycleLR(o, 1.0, total_steps=20), 20, 1.0),
        (
            OneCycleSchedule(0.5, total_steps=15, pct_start=0.4, anneal="linear", three_phase=True),
            lambda o: L.OneCycleLR(o, 0.5, total_steps=15, pct_start=0.4, anneal_strategy="linear", three_phase=True),
            15,
            0.5,
        ),
    ],
)
def test_named_schedules_equal_pytorchs_schedulers(schedule, reference, steps: int, lr: float) -> None:
    want = _torch_lrs(reference, steps, lr)
    assert [schedule.value(t, 0) for t in range(steps)] == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert schedule_from_dict(json.loads(json.dumps(schedule.to_dict()))) == schedule


def test_named_schedules_hold_their_last_value_and_refuse_bad_fields() -> None:
    assert CosineSchedule(0.1, t_max=5, eta_min=0.001).value(50, 0) == 0.001
    assert OneCycleSchedule(1.0, total_steps=10).value(99, 0) == OneCycleSchedule(1.0, total_steps=10).value(9, 0)
    with pytest.raises(ConfigError, match="t_max"):
        CosineSchedule(0.1, t_max=0)
    with pytest.raises(ConfigError, match="unit"):
        WarmupSchedule(5, then=CosineSchedule(0.1, t_max=5, unit="epoch"))
    with pytest.raises(ConfigError, match="pct_start"):
        OneCycleSchedule(0.1, total_steps=10, pct_start=1.5)


def _broken(opt):
    raise RuntimeError("T_max missing")


def test_bad_schedulers_and_optimizers_are_config_errors_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"lr_scheduler factory .*_broken raised RuntimeError: T_max missing"):
        Network(_module(), lr_scheduler=_broken)
    with pytest.raises(ConfigError, match="returned SGD, expected a torch.optim.lr_scheduler"):
        Network(_module(), lr_scheduler=lambda opt: opt)
    with pytest.raises(ConfigError, match="ReduceLROnPlateau"):
        Network(_module(), lr_scheduler=L.ReduceLROnPlateau)
    with pytest.raises(ConfigError, match="lr_scheduler_interval must be one of"):
        Network(_module(), lr_scheduler=COSINE, lr_scheduler_interval="batch")
    with pytest.raises(ConfigError, match="without an lr_scheduler"):
        Network(_module(), lr_scheduler_interval="epoch")
    with pytest.raises(ConfigError, match="leave lr_scheduler_interval out"):
        Network(_module(), lr_scheduler=CosineSchedule(0.1, t_max=5), lr_scheduler_interval="step")
    with pytest.raises(ConfigError, match="use one"):
        Network(_module(), updater=optim.SGD(lr=StepSchedule(0.1, 0.5, 2)), lr_scheduler=COSINE)
    with pytest.raises(ConfigError, match=r"updater factory .*Adam.* raised ValueError: Invalid learning rate"):
        Network(_module(), updater=functools.partial(torch.optim.Adam, lr=-1.0))
    with pytest.raises(ConfigError, match=r"weight_decay=0.01 is handed to torchspark's updater specs only"):
        Network(_module(), updater=SGD, weight_decay=0.01)
    with pytest.raises(ConfigError, match="LBFGS, whose step needs a closure"):
        Network(_module(), updater=torch.optim.LBFGS)


@pytest.mark.parametrize("mode", ["averaging", "sharing"])
def test_every_worker_steps_the_scheduler_as_the_reference_replicas(mode: str) -> None:
    """Worker threads running the real worker loop (both masters' algorithms) end where the reference loops' replicas
    do, whose schedulers follow their own step count; the driver's network continues the schedule."""
    from helpers import classification_batches, fit_in_process
    from reference_loops import averaging_reference, sharing_reference
    from torchspark.encoding import AdaptiveThreshold, EncoderConfig
    from torchspark.training.algorithms.sharing.settings import SharingSettings

    def network(scheduler) -> Network:
        return Network(models.mlp(12, 16, 3), updater=SGD, seed=0, lr_scheduler=scheduler)

    scheduler = lambda opt: L.OneCycleLR(opt, max_lr=0.5, total_steps=8)  # noqa: E731 (a lambda: travels pickled)
    shards = [classification_batches(4, seed=3), classification_batches(4, seed=4)]
    net, fixed = network(scheduler), network(None)
    if mode == "averaging":
        settings = {"averaging_frequency": 1, "save_updater": True}
        want = averaging_reference(net, shards, epochs=2, frequency=1, save_updater=True)
        unscheduled = averaging_reference(fixed, shards, epochs=2, frequency=1, save_updater=True)
    else:
        encoder = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3), shake_frequency=4)
        settings = SharingSettings(encoder, overlap=False).to_dict()
        want = sharing_reference(net, shards, epochs=2, overlap=False, encoder=encoder)[0][0]
        unscheduled = sharing_reference(fixed, shards, epochs=2, overlap=False, encoder=encoder)[0][0]
    fit_in_process(net, mode, settings, shards, epochs=2)
    torch.testing.assert_close(net.params(), want.params(), rtol=0, atol=1e-6)
    assert not torch.allclose(net.params(), unscheduled.params(), atol=1e-3), "the schedule must matter"
    assert net.iteration == 8 and net.current_lr() == want.current_lr()

    with pytest.raises(ConfigError, match=r"OneCycleLR.*step 9.*ValueError"):
        net.iteration = 9  # one step past the cycle: PyTorch's scheduler refuses it
        net.current_lr()
