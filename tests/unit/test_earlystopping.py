"""Early stopping without Spark: the conditions' decisions, the loop (scripted scores and real training), the
savers, the local score calculators and the configuration's refusals."""

from __future__ import annotations

import json
import math
import os
from functools import partial

import pytest
import torch

from helpers import mlp_net
from torchspark import optim
from torchspark.data import DataSet
from torchspark.earlystopping import (
    DirectoryModelSaver,
    EarlyStoppingConfiguration,
    EarlyStoppingListener,
    EvaluationCalculator,
    InMemoryModelSaver,
    InvalidScore,
    LossCalculator,
    MaxEpochs,
    MaxScore,
    MaxTime,
    NoImprovement,
    ScoreTarget,
    TerminationReason,
    condition_from_dict,
    run_early_stopping,
)
from torchspark.earlystopping.conditions import best_epoch
from torchspark.errors import ConfigError, SerializationError
from torchspark.evaluation import Evaluation
from torchspark.nn import Network

_net = partial(mlp_net, 4, 8, 3, updater=optim.SGD(lr=0.1))


def _blobs(n: int = 96, seed: int = 0) -> DataSet:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 4, generator=g) * 0.5 + torch.nn.functional.one_hot(y, 4)[:, :4].float() * 2
    return DataSet(x, y)


class Scripted:
    """A score calculator returning the next scripted score (decisions tested on exact values)."""

    def __init__(self, scores: list[float], minimize: bool = True) -> None:
        self.scores, self.minimize, self.calls = list(scores), minimize, 0

    def calculate(self, network: Network) -> float:
        self.calls += 1
        return self.scores.pop(0)


def _stamping_fit(net: Network, train_scores: list[float] | None = None):
    """fit_epoch that sets every parameter to the epoch number, so saved models show which epoch they are."""
    state = {"epoch": 0}

    def fit() -> float:
        net.set_params(torch.full((net.num_params(),), float(state["epoch"])))
        state["epoch"] += 1
        return train_scores.pop(0) if train_scores else 0.5

    return fit


# ------------------------------------------------------------------ the conditions' decisions
@pytest.mark.parametrize(
    "condition, epoch, history, minimize, stop",
    [
        (MaxEpochs(3), 1, {}, True, False),
        (MaxEpochs(3), 2, {}, True, True),
        (NoImprovement(2), 2, {0: 1.0, 1: 0.9, 2: 0.95}, True, False),
        (NoImprovement(2), 3, {0: 1.0, 1: 0.9, 2: 0.95, 3: 0.91}, True, True),
        (NoImprovement(2), 3, {0: 1.0, 1: 0.9, 2: 0.95, 3: 0.89}, True, False),
        (NoImprovement(2, min_improvement=0.05), 3, {0: 1.0, 1: 0.9, 2: 0.95, 3: 0.89}, True, True),
        (NoImprovement(1), 2, {0: 0.5, 1: 0.7, 2: 0.6}, False, True),
        (NoImprovement(1), 3, {0: 0.5, 1: 0.7, 2: 0.6}, False, False),  # epoch 3 not evaluated: no decision
        (NoImprovement(1), 1, {0: math.nan, 1: 0.9}, True, False),  # NaN is never the best
        (ScoreTarget(0.1), 0, {0: 0.2}, True, False),
        (ScoreTarget(0.1), 0, {0: 0.05}, True, True),
        (ScoreTarget(0.9), 0, {0: 0.95}, False, True),
        (ScoreTarget(0.9), 0, {0: 0.85}, False, False),
        (ScoreTarget(0.1), 0, {0: math.nan}, True, False),
    ],
)
def test_epoch_conditions(condition, epoch, history, minimize, stop) -> None:
    assert condition.terminate(epoch, history, minimize) is stop


@pytest.mark.parametrize(
    "condition, score, elapsed, stop",
    [
        (MaxTime(10), 1.0, 9.9, False),
        (MaxTime(10), 1.0, 10.0, True),
        (MaxScore(5.0), 4.9, 0, False),
        (MaxScore(5.0), 5.1, 0, True),
        (MaxScore(5.0), math.nan, 0, True),
        (InvalidScore(), 1e30, 0, False),
        (InvalidScore(), math.inf, 0, True),
        (InvalidScore(), math.nan, 0, True),
    ],
)
def test_iteration_conditions(condition, score, elapsed, stop) -> None:
    assert condition.terminate(score, elapsed) is stop


def test_best_epoch_keeps_the_earlier_of_ties_and_respects_min_improvement() -> None:
    assert best_epoch({0: 1.0, 1: 0.5, 2: 0.5}, minimize=True) == 1
    assert best_epoch({0: 1.0, 1: 0.99}, minimize=True, min_improvement=0.05) == 0
    assert best_epoch({0: math.nan}, minimize=True) == -1


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: MaxEpochs(0), "max_epochs"),
        (lambda: NoImprovement(0), "patience"),
        (lambda: NoImprovement(2, min_improvement=-1), "min_improvement"),
        (lambda: MaxTime(0), "seconds"),
        (lambda: ScoreTarget(math.nan), "target"),
        (lambda: condition_from_dict({"type": "nope"}), "unknown termination condition"),
    ],
)
def test_bad_conditions_are_refused(bad, match) -> None:
    with pytest.raises(ConfigError, match=match):
        bad()


def test_conditions_round_trip_through_json() -> None:
    for c in (MaxEpochs(4), NoImprovement(3, 0.01), ScoreTarget(0.2), MaxTime(60.0), MaxScore(9.0), InvalidScore()):
        assert condition_from_dict(json.loads(json.dumps(c.to_dict()))) == c


# ------------------------------------------------------------------ the loop
def test_no_improvement_stops_and_keeps_the_best_epochs_weights() -> None:
    net = _net()
    calc = Scripted([1.0, 0.8, 0.9, 0.85, 0.95, 0.7])
    config = EarlyStoppingConfiguration(calc, epoch_conditions=[MaxEpochs(10), NoImprovement(2)])
    result = run_early_stopping(config, net, _stamping_fit(net))
    assert result.termination_reason is TerminationReason.EPOCH_CONDITION
    assert "NoImprovement" in result.termination_details
    assert result.total_epochs == 4 and result.best_epoch == 1 and result.best_score == 0.8
    assert result.score_vs_epoch == {0: 1.0, 1: 0.8, 2: 0.9, 3: 0.85}
    assert torch.all(result.best_model.params() == 1.0)  # the weights of epoch 1, not the last (3)
    assert torch.all(net.params() == 3.0)


def test_maximized_metric_and_score_target() -> None:
    net = _net()
    config = EarlyStoppingConfiguration(
        Scripted([0.5, 0.7, 0.6, 0.95], minimize=False), epoch_conditions=[MaxEpochs(10), ScoreTarget(0.9)]
    )
    result = run_early_stopping(config, net, _stamping_fit(net))
    assert (result.best_epoch, result.best_score, result.total_epochs) == (3, 0.95, 4)
    assert "ScoreTarget" in result.termination_details


def test_max_epochs_and_evaluate_every_n_epochs() -> None:
    net = _net()
    calc = Scripted([0.9, 0.8])
    config = EarlyStoppingConfiguration(calc, epoch_conditions=[MaxEpochs(5)], evaluate_every_n_epochs=2)
    result = run_early_stopping(config, net, _stamping_fit(net))
    assert result.total_epochs == 5 and calc.calls == 2
    assert result.score_vs_epoch == {1: 0.9, 3: 0.8}
    assert set(result.train_score_vs_epoch) == {0, 1, 2, 3, 4}
    assert result.best_epoch == 3


def test_invalid_training_score_ends_the_run_before_scoring() -> None:
    net = _net()
    calc = Scripted([0.9, 0.8, 0.7])
    config = EarlyStoppingConfiguration(calc, epoch_conditions=[MaxEpochs(10)], iteration_conditions=[InvalidScore()])
    result = run_early_stopping(config, net, _stamping_fit(net, [0.5, math.nan, 0.4]))
    assert result.termination_reason is TerminationReason.ITERATION_CONDITION
    assert "InvalidScore" in result.termination_details and "epoch 1" in result.termination_details
    assert result.total_epochs == 2 and calc.calls == 1 and result.best_epoch == 0


def test_max_time_with_a_fake_clock() -> None:
    net = _net()
    now = [0.0]

    def fit() -> float:
        now[0] += 4.0
        return 0.5

    config = EarlyStoppingConfiguration(Scripted([1.0] * 10), iteration_conditions=[MaxTime(10)])
    result = run_early_stopping(config, net, fit, clock=lambda: now[0])
    assert result.total_epochs == 3 and "MaxTime" in result.termination_details


def test_a_failing_epoch_ends_with_reason_error_and_the_best_model_so_far() -> None:
    net = _net()
    stamp = _stamping_fit(net)
    calls = [0]

    def fit() -> float:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("executor lost")
        return stamp()

    config = EarlyStoppingConfiguration(Scripted([0.5, 0.4]), epoch_conditions=[MaxEpochs(10)])
    result = run_early_stopping(config, net, fit)
    assert result.termination_reason is TerminationReason.ERROR
    assert "executor lost" in result.termination_details
    assert result.best_epoch == 1 and torch.all(result.best_model.params() == 1.0)


def test_listener_and_save_last_model() -> None:
    events = []

    class Recorder(EarlyStoppingListener):
        def on_start(self, config, network):
            events.append("start")

        def on_epoch(self, epoch, score, config, network):
            events.append((epoch, score))

        def on_completion(self, result):
            events.append(("done", result.total_epochs))

    net = _net()
    saver = InMemoryModelSaver()
    config = EarlyStoppingConfiguration(
        Scripted([0.5, 0.6]), epoch_conditions=[MaxEpochs(2)], model_saver=saver, save_last_model=True
    )
    run_early_stopping(config, net, _stamping_fit(net), listener=Recorder())
    assert events == ["start", (0, 0.5), (1, 0.6), ("done", 2)]
    assert torch.all(saver.latest().params() == 1.0) and torch.all(saver.best().params() == 0.0)


@pytest.mark.parametrize("saver", [InMemoryModelSaver, DirectoryModelSaver])
def test_savers_have_no_java_style_getters(saver) -> None:
    assert {"best", "latest"} <= set(dir(saver)) and not {"get_best", "get_latest"} & set(dir(saver))


def test_real_training_with_loss_calculator_improves_on_the_first_epoch() -> None:
    net = _net()
    train, val = _blobs(192, seed=1), _blobs(96, seed=2)
    config = EarlyStoppingConfiguration(LossCalculator(val), epoch_conditions=[MaxEpochs(4)])
    result = run_early_stopping(config, net, lambda: net.fit(train, batch_size=16).score(train))
    assert result.best_score < result.score_vs_epoch[0]
    assert result.best_model.score(val) == pytest.approx(result.best_score, rel=1e-6)


def test_local_calculators_agree_with_the_network() -> None:
    net, val = _net(), _blobs(64)
    acc = EvaluationCalculator(val, "accuracy")
    assert acc.minimize is False and acc.calculate(net) == net.evaluate(val, Evaluation()).accuracy()
    assert EvaluationCalculator(val, "mse").minimize is True
    assert LossCalculator(val).calculate(net) == pytest.approx(net.score(val))
    total = LossCalculator(val, average=False).calculate(net)
    assert total == pytest.approx(net.score(val) * 64, rel=1e-5)
    with pytest.raises(ConfigError, match="loss calculator"):
        EvaluationCalculator(val, "loss")


# ------------------------------------------------------------------ savers
def test_directory_saver_switches_atomically_and_reloads(tmp_path) -> None:
    net = _net()
    saver = DirectoryModelSaver(str(tmp_path))
    config = EarlyStoppingConfiguration(
        Scripted([0.9, 0.5, 0.7]), epoch_conditions=[MaxEpochs(3)], model_saver=saver, save_last_model=True
    )
    result = run_early_stopping(config, net, _stamping_fit(net))
    pointer = json.loads((tmp_path / "best_model.json").read_text())
    assert pointer["epoch"] == 1 and pointer["score"] == 0.5
    # one directory per kept model: the replaced best (epoch 0) is gone
    kept = sorted(p for p in os.listdir(tmp_path) if not p.endswith(".json"))
    assert len(kept) == 2 and {k.split("-")[0] for k in kept} == {"best_model", "latest_model"}
    assert (tmp_path / pointer["path"] / "weights.safetensors").exists()
    assert torch.all(DirectoryModelSaver.load_best(str(tmp_path)).params() == 1.0)
    assert torch.all(result.best_model.params() == 1.0)
    assert torch.all(saver.latest().params() == 2.0)


def test_directory_saver_refuses_a_pointer_outside_its_directory(tmp_path) -> None:
    (tmp_path / "best_model.json").write_text(json.dumps({"path": "../elsewhere", "epoch": 0, "score": 1}))
    with pytest.raises(Exception, match="outside"):
        DirectoryModelSaver.load_best(str(tmp_path))


def test_directory_saver_refuses_an_unsaveable_network_up_front(tmp_path) -> None:
    net = Network(torch.nn.Linear(4, 3), loss=lambda out, y: out.sum())  # a callable loss: only pickle stores it
    with pytest.raises(ConfigError, match="its loss is a callable.*InMemoryModelSaver"):
        DirectoryModelSaver(str(tmp_path)).check(net)


def test_directory_saver_keeps_a_network_of_your_own_module(tmp_path) -> None:
    """A plain module (nn.Linear: no spec, its sizes not recorded) saves; the saver reads it back into a copy of
    the module it saved; another process's load_best needs module= (the error says so) and then matches."""
    net = Network(torch.nn.Linear(4, 3), updater=optim.Adam(lr=1e-2), seed=0)
    saver = DirectoryModelSaver(str(tmp_path))
    saver.check(net)
    saver.save_best(net, epoch=0, score=0.5)
    saved = net.params()
    with torch.no_grad():
        net.params_view().add_(1.0)  # training moves on; the saved best must not follow
    best = saver.best()
    assert best is not None and best.module is not net.module
    assert torch.equal(best.params(), saved) and not torch.equal(best.params(), net.params())
    with pytest.raises(SerializationError, match=r"module=Linear\(\.\.\.\)"):
        DirectoryModelSaver.load_best(str(tmp_path))
    again = DirectoryModelSaver.load_best(str(tmp_path), module=torch.nn.Linear(4, 3))
    assert torch.equal(again.params(), best.params()) and torch.equal(again.updater_state(), best.updater_state())


# ------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(), "at least one termination condition"),
        (dict(epoch_conditions=[MaxTime(5)]), "not an epoch condition"),
        (dict(iteration_conditions=[MaxEpochs(5)]), "not an iteration condition"),
        (dict(epoch_conditions=[MaxEpochs(5)], evaluate_every_n_epochs=0), "evaluate_every_n_epochs"),
        (dict(epoch_conditions=[MaxEpochs(5)], model_saver="dir"), "model_saver"),
    ],
)
def test_configuration_refusals(kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        EarlyStoppingConfiguration(Scripted([]), **kwargs)


def test_configuration_needs_a_score_calculator() -> None:
    with pytest.raises(ConfigError, match="score_calculator"):
        EarlyStoppingConfiguration(None, epoch_conditions=[MaxEpochs(2)])  # type: ignore[arg-type]


@pytest.mark.parametrize("save_updater", [True, False])
def test_directory_saver_save_updater_option(tmp_path, save_updater) -> None:
    saver = DirectoryModelSaver(str(tmp_path), save_updater=save_updater)
    saver.save_best(_net(), 0, 0.5)
    sub = json.loads((tmp_path / "best_model.json").read_text())["path"]
    assert (tmp_path / sub / "updater.safetensors").exists() is save_updater
