"""The pieces of torchspark.nn beside Network: the zoo registry, the flat state, the forward pass and the portable
parts (each checked on its own; test_network.py checks Network's behaviour through them)."""

from __future__ import annotations

import grimp
import pytest
import torch

from torchspark import models, optim
from torchspark.data import DataSet
from torchspark.errors import ConfigError, DataError
from torchspark.nn import Network, NetworkBlueprint, network_spec, trust
from torchspark.nn.flat import FlatState
from torchspark.nn.forward import as_list, batch_loss, forward, unpack
from torchspark.nn.portable import Blueprint, portable_parts, read_network
from torchspark.nn.spec import module_spec
from torchspark.nn.zoo import ZOO, zoo_path


def _data(n: int = 16) -> DataSet:
    g = torch.Generator().manual_seed(0)
    return DataSet(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


def test_the_zoo_is_one_registry_that_the_others_read() -> None:
    assert models.ZOO is ZOO and network_spec.ZOO is ZOO
    assert tuple(f"torchspark.models:{name}" for name in ZOO) == trust.ZOO_FACTORIES
    assert set(ZOO) <= set(models.__all__)
    for name, factory in ZOO.items():
        assert getattr(models, name) is factory
        assert trust.CodePolicy().resolve(zoo_path(name), "module factory", "test") is factory
    assert module_spec(models.mlp(4, 8, 3))["factory"] == "torchspark.models:mlp"  # what saved files name


def test_nn_never_imports_the_public_models_module() -> None:
    graph = grimp.build_graph("torchspark", cache_dir=None)
    assert not graph.chain_exists(importer="torchspark.nn", imported="torchspark.models", as_packages=True)


def test_zoo_factories_validate_their_sizes() -> None:
    with pytest.raises(ConfigError, match=r"^n_in must be an integer >= 1, got 0$"):
        models.mlp(0, 8, 3)
    with pytest.raises(ConfigError, match=r"^hidden width must be an integer >= 1, got 0$"):
        models.mlp(4, [8, 0], 3)
    with pytest.raises(ConfigError, match=r"^height must be an integer >= 1, got True$"):
        models.lenet(1, 10, True, 28)


def test_flat_state_views_every_parameter_in_one_buffer() -> None:
    module = models.mlp(4, 8, 3)
    state = FlatState(module, False, lambda ps: torch.optim.Adam(ps, lr=0.1))
    assert state.num_params() == sum(p.numel() for p in module.parameters())
    for p in state.parameters:  # every parameter's storage is the flat buffer's
        assert p.data.untyped_storage().data_ptr() == state.flat.untyped_storage().data_ptr()
    state.set_params(torch.zeros(state.num_params()))
    assert all(float(p.detach().abs().sum()) == 0 for p in module.parameters())
    state.apply_update(-torch.ones(state.num_params()))
    assert torch.equal(state.params(), torch.ones(state.num_params()))
    state.apply_update_at(torch.tensor([0, 2]), torch.tensor([1.0, 1.0]))
    assert state.params()[:3].tolist() == [0.0, 1.0, 0.0]
    # Adam's state (two moments per value, a step count per tensor) exists, zero, before the first step, so the
    # flat updater view has its final length
    assert state.updater_state_size() == 2 * state.num_params() + len(state.parameters)
    assert float(state.updater_state().abs().sum()) == 0


def test_flat_state_refuses_a_module_without_parameters() -> None:
    with pytest.raises(ConfigError, match="has no parameters to train"):
        FlatState(torch.nn.ReLU(), False, lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(DataError, match="set_params needs a 1-D tensor of"):
        FlatState(models.mlp(4, 8, 3), False, lambda ps: torch.optim.SGD(ps, lr=0.1)).set_params(torch.zeros(3))


def test_network_methods_are_its_flat_state() -> None:
    net = Network(models.mlp(4, 8, 3), updater=optim.Adam(lr=0.01), seed=0)
    net.fit(_data(), batch_size=8)
    assert torch.equal(net.params(), net.params_view())
    assert net.updater_state_size() == net.updater_state().numel() == 2 * net.num_params() + 4  # + a step per tensor
    net.reset_updater_state()
    assert float(net.updater_state().abs().sum()) == 0


def test_forward_functions_read_the_network_through_its_public_surface() -> None:
    net = Network(models.mlp(4, 8, 3), seed=0)
    data = _data()
    feats, labels, fmask, lmasks = unpack(net, data)
    assert feats[0].dtype == torch.float32 and labels is not None and fmask is None and lmasks is None
    outputs = forward(net, feats)
    assert [tuple(o.shape) for o in outputs] == [(16, 3)]
    loss, n = batch_loss(net, data, validate=True)
    assert n == 16 and float(loss.detach()) == pytest.approx(net.score(data))
    assert as_list((1, 2)) == [1, 2] and as_list(3) == [3]


def test_portable_parts_build_the_class_they_are_given(tmp_path) -> None:
    class Tagged(Network):
        pass

    net = Network(models.mlp(4, 8, 3), updater=optim.Adam(lr=0.01), seed=0).fit(_data(), batch_size=8)
    config, objects = portable_parts(net)
    assert objects == {} and config["module"]["factory"] == "torchspark.models:mlp"
    twin = Blueprint.of(net).build_as(Tagged)
    assert type(twin) is Tagged and torch.equal(twin.params(), net.params())
    assert torch.equal(twin.updater_state(), net.updater_state()) and twin.iteration == net.iteration
    net.save(str(tmp_path / "m"))
    loaded = read_network(Tagged, str(tmp_path / "m"))
    assert type(loaded) is Tagged and torch.equal(loaded.params(), net.params())
    assert type(NetworkBlueprint.from_bytes(NetworkBlueprint.of(net).to_bytes()).build()) is Network
