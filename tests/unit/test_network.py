"""Network: flat views, compute/apply update, fit, output, save/load, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from helpers import uniform_data
from torchspark import models, optim
from torchspark.data import DataSet, MultiDataSet
from torchspark.errors import ConfigError, DataError, SerializationError, TrainingError
from torchspark.nn import Network, from_factory

UPDATERS = [
    optim.SGD(lr=0.1),
    optim.SGD(lr=0.05, momentum=0.9),
    optim.SGD(lr=0.05, momentum=0.9, nesterov=True),
    optim.Adam(lr=1e-2),
    optim.AdamW(lr=1e-2),
    optim.RMSprop(lr=1e-3),
    optim.AdaGrad(lr=0.05),
    optim.Adam(lr=1e-2, fused=False),
]

FUSABLE = [
    (optim.SGD(lr=0.05, momentum=0.9), torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
    (optim.Adam(lr=1e-2), torch.optim.Adam, dict(lr=1e-2)),
    (optim.AdamW(lr=1e-2), torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.0)),  # the network's decay: 0
    (optim.AdaGrad(lr=0.05), torch.optim.Adagrad, dict(lr=0.05)),
]


def test_flat_param_views_round_trip() -> None:
    net = Network(models.mlp(64, 16, 10), seed=1)
    p = net.params()
    assert p.shape == (net.num_params(),) == (64 * 16 + 16 + 16 * 10 + 10,)
    new = torch.randn_like(p)
    net.set_params(new)
    assert torch.equal(net.params(), new)
    # the module's parameters are views of the flat buffer
    first = next(net.module.parameters())
    assert torch.equal(first.detach().reshape(-1), new[: first.numel()])
    p2 = net.params()
    p2.add_(1.0)  # params() is a copy
    assert torch.equal(net.params(), new)


@pytest.mark.parametrize("updater", UPDATERS, ids=lambda u: repr(u))
def test_updater_state_round_trip(updater: optim.UpdaterSpec) -> None:
    net = Network(models.mlp(64, 8, 10), updater=updater, seed=0)
    state0 = net.updater_state()
    assert torch.count_nonzero(state0) == 0, "state must be zeros before the first step"
    net.fit(uniform_data(64), batch_size=16)
    state = net.updater_state()
    assert state.shape == state0.shape
    other = Network(models.mlp(64, 8, 10), updater=updater, seed=0)
    other.set_updater_state(state)
    assert torch.equal(other.updater_state(), state)


@pytest.mark.parametrize("updater", UPDATERS, ids=lambda u: repr(u))
def test_compute_then_apply_update_equals_one_step(updater: optim.UpdaterSpec) -> None:
    data = uniform_data(64)
    a = Network(models.mlp(64, 8, 10), updater=updater, seed=3)
    b = Network(models.mlp(64, 8, 10), updater=updater, seed=3)
    for batch in data.split(16):  # several steps so momentum / Adam moments matter
        before = a.params()
        update = a.compute_update(batch)
        assert torch.equal(a.params(), before), "compute_update must not move the parameters"
        a.apply_update(update)
        b.train_step(batch)
        torch.testing.assert_close(a.params(), b.params())
        torch.testing.assert_close(a.updater_state(), b.updater_state())


def test_fit_learns_digits_like_problem() -> None:
    from torchspark.datasets import synthetic_classification

    data = synthetic_classification(600, 20, 4, seed=0)
    net = Network(models.mlp(20, 32, 4), updater=optim.Adam(lr=1e-2), seed=0)
    before = net.score(data)
    net.fit(data, epochs=5, batch_size=32)
    assert net.score(data) < before * 0.5
    assert net.evaluate(data).accuracy() > 0.9
    assert net.epoch == 5 and net.iteration == 5 * math.ceil(600 / 32)


def test_output_applies_activation() -> None:
    net = Network(models.mlp(64, 8, 10), seed=0)
    out = net.output(uniform_data(64).features)
    torch.testing.assert_close(out.sum(dim=1), torch.ones(64))
    net_bce = Network(models.mlp(64, 8, 3), loss="bce_with_logits", seed=0)
    out = net_bce.output(np.random.rand(5, 1, 8, 8).astype(np.float32))
    assert out.shape == (5, 3) and float(out.min()) >= 0 and float(out.max()) <= 1
    # chunked output equals one-shot
    features = uniform_data(64).features
    torch.testing.assert_close(net.output(features, batch_size=7), net.output(features))


def test_seed_makes_initialisation_deterministic() -> None:
    a = Network(lambda: models.mlp(64, 8, 10), seed=42)
    b = Network(models.mlp(64, 8, 10), seed=42)
    c = Network(lambda: models.mlp(64, 8, 10), seed=43)
    assert torch.equal(a.params(), b.params())
    assert not torch.equal(a.params(), c.params())


def test_label_mask_excludes_examples() -> None:
    data = uniform_data(8)
    net = Network(models.mlp(64, 8, 10), seed=0)
    mask = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.float32)
    masked = DataSet(data.features, data.labels, labels_mask=mask)
    assert net.score(masked) == pytest.approx(net.score(data.slice(0, 4)), rel=1e-6)


def test_multidataset_two_inputs_two_outputs() -> None:
    class TwoHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 4)
            self.b = nn.Linear(2, 4)
            self.cls = nn.Linear(4, 3)
            self.reg = nn.Linear(4, 1)

        def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = torch.relu(self.a(x1) + self.b(x2))
            return self.cls(h), self.reg(h)

    g = torch.Generator().manual_seed(0)
    x1, x2 = torch.randn(40, 3, generator=g), torch.randn(40, 2, generator=g)
    y1 = (x1[:, 0] > 0).long()
    y2 = x2[:, :1].clone()
    data = MultiDataSet([x1, x2], [y1, y2])
    net = Network(TwoHead(), loss=["cross_entropy", "mse"], updater=optim.Adam(lr=1e-2), seed=0)
    before = net.score(data)
    net.fit(data, epochs=20, batch_size=10)
    assert net.score(data) < before
    probs, reg = net.output([x1, x2])
    assert probs.shape == (40, 3) and reg.shape == (40, 1)


def test_save_load_identical_outputs(tmp_path) -> None:
    data = uniform_data(64)
    net = Network(models.lenet(1, 10, 8, 8), updater=optim.SGD(lr=0.05, momentum=0.9), seed=0)
    net.fit(data, batch_size=16)
    path = str(tmp_path / "model")
    net.save(path)
    loaded = Network.load(path)
    torch.testing.assert_close(loaded.output(data.features), net.output(data.features), rtol=0, atol=0)
    assert torch.equal(loaded.updater_state(), net.updater_state())
    assert loaded.iteration == net.iteration and loaded.epoch == net.epoch
    # training continues identically after a reload
    net.train_step(data.slice(0, 16))
    loaded.train_step(data.slice(0, 16))
    assert torch.equal(loaded.params(), net.params())


def test_save_without_updater_and_memory_fs() -> None:
    net = Network(models.mlp(64, 8, 10), updater=optim.Adam(lr=1e-3), seed=0)
    net.fit(uniform_data(64), batch_size=32)
    net.save("memory://models/m1", save_updater=False)
    loaded = Network.load("memory://models/m1")
    assert torch.equal(loaded.params(), net.params())
    assert torch.count_nonzero(loaded.updater_state()) == 0


def test_from_factory_saves_as_json(tmp_path) -> None:
    module = from_factory("torchspark.models:mlp", n_in=64, hidden=[8, 8], n_out=10)
    net = Network(module, seed=0)
    net.save(str(tmp_path / "m"))
    assert not (tmp_path / "m" / "objects.pkl").exists()
    config = (tmp_path / "m" / "config.json").read_text()
    assert "torchspark.models:mlp" in config
    assert torch.equal(Network.load(str(tmp_path / "m")).params(), net.params())


def test_plain_module_saves_without_pickle(tmp_path) -> None:
    """A module with no spec (here an nn.Sequential) saves as safetensors + its class, never pickled; loading it
    needs module= (its layers are not recorded); allow_pickle=True still pickles it when asked."""
    net = Network(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), seed=0)
    net.save(str(tmp_path / "m"))
    assert not (tmp_path / "m" / "objects.pkl").exists()
    spec = json.loads((tmp_path / "m" / "config.json").read_text())["module"]
    assert spec["class"] == "torch.nn.modules.container:Sequential" and spec["rebuild"] == "none"
    with pytest.raises(SerializationError, match=r"module=Sequential\(\.\.\.\)"):
        Network.load(str(tmp_path / "m"), trust_code=True)
    loaded = Network.load(str(tmp_path / "m"), module=nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    assert torch.equal(loaded.params(), net.params())
    net.save(str(tmp_path / "p"), allow_pickle=True)
    with pytest.raises(SerializationError, match="allow_pickle"):
        Network.load(str(tmp_path / "p"))
    loaded = Network.load(str(tmp_path / "p"), allow_pickle=True)
    assert torch.equal(loaded.params(), net.params())
    # module= replaces the pickled module: nothing is unpickled, so allow_pickle is not needed
    into = Network.load(str(tmp_path / "p"), module=nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    assert torch.equal(into.params(), net.params())


def test_load_errors(tmp_path) -> None:
    with pytest.raises(SerializationError, match="no saved network"):
        Network.load(str(tmp_path / "missing"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text("{not json")
    with pytest.raises(SerializationError, match="config.json"):
        Network.load(str(tmp_path / "junk"))


def test_copy_is_independent() -> None:
    net = Network(models.mlp(64, 8, 10), updater=optim.Adam(lr=1e-2), seed=0)
    net.fit(uniform_data(64), batch_size=16)
    twin = net.copy()
    assert torch.equal(twin.params(), net.params())
    assert torch.equal(twin.updater_state(), net.updater_state())
    twin.train_step(uniform_data(64).slice(0, 8))
    assert not torch.equal(twin.params(), net.params())


def test_deepcopy_keeps_the_flat_parameter_view() -> None:
    import copy

    net = Network(models.mlp(64, 8, 10), updater=optim.Adam(lr=1e-2), seed=0)
    net.fit(uniform_data(64), batch_size=16)
    twin = copy.deepcopy(net)
    assert twin.iteration == net.iteration and torch.equal(twin.updater_state(), net.updater_state())
    batch = uniform_data(64, seed=1).slice(0, 8)
    expected = net.copy().compute_update(batch)
    got = twin.compute_update(batch)
    assert got.abs().sum() > 0 and torch.equal(got, expected)  # trains through its own flat buffer
    twin.train_step(batch)
    assert not torch.equal(twin.params(), net.params())  # independent of the original
    assert twin.params_view().data_ptr() == next(twin.module.parameters()).data_ptr()


# ------------------------------------------------------------------ bad input
def test_bad_feature_shape_names_shape() -> None:
    net = Network(models.mlp(64, 8, 10), seed=0)
    bad = DataSet(torch.rand(10, 1, 5, 5), torch.zeros(10, dtype=torch.long))
    with pytest.raises(DataError, match=r"\(10, 1, 5, 5\)"):
        net.fit(bad)


def test_label_out_of_range() -> None:
    net = Network(models.mlp(64, 8, 10), seed=0)
    bad = DataSet(torch.rand(10, 1, 8, 8), torch.full((10,), 10, dtype=torch.long))
    with pytest.raises(DataError, match="label index 10"):
        net.fit(bad)


def test_nan_features_rejected() -> None:
    x = torch.rand(10, 1, 8, 8)
    x[3, 0, 2, 2] = float("nan")
    net = Network(models.mlp(64, 8, 10), seed=0)
    with pytest.raises(DataError, match="NaN|nan|finite"):
        net.fit(DataSet(x, torch.zeros(10, dtype=torch.long)))


def test_divergence_names_step_and_suggests_lower_lr() -> None:
    data = uniform_data(64)
    net = Network(models.mlp(64, 8, 10), updater=optim.SGD(lr=1e30), seed=0)
    with pytest.raises(TrainingError, match="iteration .*[Ll]ower the learning rate"):
        net.fit(data, epochs=5, batch_size=8)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"loss": "hinge"}, "unknown loss 'hinge'"),
        ({"updater": "adamax"}, "unknown updater 'adamax'"),
        ({"weight_decay": -1}, "weight_decay"),
        ({"gradient_clip": 0}, "gradient_clip"),
    ],
)
def test_bad_config(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Network(models.mlp(64, 8, 10), **kwargs)


@pytest.mark.parametrize("bad", [dict(lr=0), dict(lr=-1), dict(momentum=1.5), dict(nesterov=True)])
def test_bad_sgd(bad: dict) -> None:
    with pytest.raises(ConfigError, match="SGD"):
        optim.SGD(**bad)


def test_empty_data_and_bad_batch_size() -> None:
    net = Network(models.mlp(64, 8, 10), seed=0)
    with pytest.raises(DataError, match="no data|empty"):
        net.fit([])
    with pytest.raises(DataError, match="batch_size"):
        net.fit(uniform_data(64), batch_size=0)


def test_updater_spec_json_round_trip() -> None:
    for spec in UPDATERS:
        assert optim.updater_from_dict(spec.to_dict()) == spec
    assert optim.updater_from_dict({"type": "adam", "lr": 0.1}).fused is None  # configs saved before the option


def _train_module(make_opt, steps: int = 12) -> torch.Tensor:
    """Parameters of a small MLP after ``steps`` minibatches with the optimizer ``make_opt(params)`` builds."""
    torch.manual_seed(0)
    module = models.mlp(64, 16, 10)
    opt = make_opt(list(module.parameters()))
    data = uniform_data(16 * steps)
    for batch in data.split(16):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(module(batch.features.reshape(16, 64)), batch.labels).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


@pytest.mark.parametrize("spec,torch_cls,kwargs", FUSABLE, ids=lambda v: getattr(v, "__name__", repr(v)))
def test_fused_kernels_by_default_and_equal_to_the_unfused_loop(spec, torch_cls, kwargs) -> None:
    from dataclasses import replace

    opt = spec.build([torch.nn.Parameter(torch.zeros(3))])
    assert opt.defaults["fused"] is True, "CPU parameters get PyTorch's fused kernel by default"
    reference = _train_module(lambda ps: torch_cls(ps, **kwargs))  # torch's default (for-loop) implementation
    fused = _train_module(spec.build)
    unfused = _train_module(replace(spec, fused=False).build)
    assert torch.equal(unfused, reference), "fused=False is the default torch optimizer, bit for bit"
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)


def test_fused_is_skipped_where_torch_has_no_kernel_and_validated() -> None:
    from torchspark.optim import _use_fused

    assert _use_fused(None, [torch.nn.Parameter(torch.zeros(2))]) is True
    assert _use_fused(None, [torch.nn.Parameter(torch.zeros(2, device="meta"))]) is False  # no fused kernel on meta
    assert _use_fused(False, [torch.nn.Parameter(torch.zeros(2))]) is False
    assert optim.RMSprop().build([torch.nn.Parameter(torch.zeros(2))]) is not None  # RMSprop has no fused option
    with pytest.raises(ConfigError, match=r"fused must be True or False or None \(automatic\)"):
        optim.Adam(fused="yes")  # type: ignore[arg-type]


def test_float64_features_train_a_float32_network() -> None:
    """numpy's default dtype used to fail with 'Check the feature shape'; floating features take the network's."""
    x = np.random.default_rng(0).random((32, 6))  # float64
    y = np.random.default_rng(1).integers(0, 3, 32)
    net = Network(models.mlp(6, 8, 3), seed=0)
    net.fit(DataSet(x, y), batch_size=8)
    assert net.iteration == 4 and np.isfinite(net.score(DataSet(x, y)))
    assert net.output(x).dtype.__str__() == "torch.float32"
