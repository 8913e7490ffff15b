"""``Network(compile=...)``: torch.compile of the forward pass on CPU with backends that need no C++ compiler
("eager", "aot_eager"; "inductor" when a compiler is present), the flat parameter views still driving the compiled
forward, the setting travelling with the network (saves, copies, worker replicas), and the errors."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch._dynamo
from safetensors.torch import load_file

from helpers import fit_in_process
from torchspark import DataSet, Network, models, optim
from torchspark.encoding import AdaptiveThreshold, EncoderConfig
from torchspark.errors import ConfigError, SetupError
from torchspark.nn import NetworkBlueprint
from torchspark.nn.compiled import COMPILE_MODES, CompiledForward, compile_backends, compile_options
from torchspark.training.algorithms.sharing.settings import SharingSettings

#: one entry per run of a graph the counting backend compiled, by any network (threads of workers included)
COMPILED: list[int] = []


@torch._dynamo.register_backend
def torchspark_test_counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
    """A real dynamo backend that runs the traced graph as it is and counts every run (dynamo reuses a compiled
    graph for another module of the same structure, so runs, not compilations, show which forwards it served)."""

    def run(*args: torch.Tensor):
        COMPILED.append(1)
        return gm.forward(*args)

    return run


@torch._dynamo.register_backend
def torchspark_test_no_compiler(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
    """A real dynamo backend that cannot compile on this machine (as inductor without a C++ compiler)."""
    raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with empty compile caches: dynamo keys its cache on the forward's code object, shared by
    every network of the same module class, and past ``recompile_limit`` variants (backends, shapes, modes) it runs
    that code uncompiled; other tests of the session compile the zoo MLP too."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _data(n: int = 64, seed: int = 0) -> DataSet:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    return DataSet(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def _net(compile=False, updater=None) -> Network:
    return Network(models.mlp(10, 16, 3), updater=updater or optim.SGD(lr=0.1, momentum=0.9), seed=0, compile=compile)


# ------------------------------------------------------------------ the setting
@pytest.mark.parametrize(
    "value, options",
    [(False, None), (True, {}), ("max-autotune", {"mode": "max-autotune"}), ("aot_eager", {"backend": "aot_eager"})],
)
def test_compile_options_of_each_setting(value, options) -> None:
    assert compile_options(value) == options


@pytest.mark.parametrize("bad", ["no_such_backend", "fast", 1, 0, None, ["eager"]])
def test_an_unknown_backend_or_mode_is_refused_listing_the_known_ones(bad) -> None:
    with pytest.raises(
        ConfigError,
        match=r"compile must be one of \[.*'reduce-overhead'.*'aot_eager'.*'inductor'"
        r".*or True \(the default backend\) or False",
    ):
        _net(compile=bad)
    assert set(COMPILE_MODES) | {"eager", "aot_eager", "inductor"} <= set(
        _valid := [*COMPILE_MODES, *compile_backends()]
    )
    assert "torchspark_test_counting" in _valid


def test_compile_is_off_by_default_and_forward_module_is_the_module() -> None:
    net = _net()
    assert net.compile is False and net.forward_module is net.module
    compiled = _net(compile="eager")
    assert isinstance(compiled.forward_module, CompiledForward) and compiled.forward_module.backend == "eager"


# ------------------------------------------------------------------ the flat views drive the compiled forward
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "torchspark_test_counting"])
def test_compiled_fit_equals_eager_fit(backend) -> None:
    data = _data()
    eager, compiled = _net(), _net(compile=backend)
    before = len(COMPILED)
    eager.fit(data, epochs=2, batch_size=16)
    compiled.fit(data, epochs=2, batch_size=16)
    torch.testing.assert_close(compiled.params(), eager.params(), rtol=0, atol=1e-6)
    torch.testing.assert_close(compiled.updater_state(), eager.updater_state(), rtol=0, atol=1e-6)
    torch.testing.assert_close(compiled.output(data.features), eager.output(data.features), rtol=0, atol=1e-6)
    if backend == "torchspark_test_counting":
        assert len(COMPILED) - before >= 2 * 4  # every training forward ran compiled (fails if compile is ignored)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_set_params_and_apply_update_change_what_the_compiled_forward_uses(backend) -> None:
    data = _data(16)
    net, plain = _net(compile=backend), _net()
    net.train_step(data, validate=True)  # compiled and run once: a graph exists
    plain.train_step(data, validate=True)  # the same momentum
    x = data.features
    new = torch.randn(net.num_params(), generator=torch.Generator().manual_seed(5))
    net.set_params(new)
    assert torch.equal(net.params(), new)
    plain.set_params(new)
    torch.testing.assert_close(net.output(x), plain.output(x), rtol=0, atol=1e-6)
    update = torch.full((net.num_params(),), 0.01)
    net.apply_update(update)
    plain.apply_update(update)
    torch.testing.assert_close(net.output(x), plain.output(x), rtol=0, atol=1e-6)
    # and the step writes the parameters the flat buffer holds: params() moves by the compiled step's update
    before = net.params()
    net.train_step(data)
    plain.train_step(data)
    assert not torch.equal(net.params(), before)
    torch.testing.assert_close(net.params(), plain.params(), rtol=0, atol=1e-6)


def test_compute_update_and_sharing_see_the_compiled_step() -> None:
    """Gradient sharing's fused step swaps each parameter's data for its residual view during the updater's step:
    the compiled forward must still read the real parameters afterwards (compiled run == eager run, bit-close)."""
    shards = [[_data(16, seed=s) for s in range(4)], [_data(16, seed=10 + s) for s in range(4)]]
    settings = SharingSettings(EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3))).to_dict()
    eager, compiled = _net(), _net(compile="aot_eager")
    fit_in_process(eager, "sharing", settings, shards, epochs=2)
    fit_in_process(compiled, "sharing", settings, shards, epochs=2)
    torch.testing.assert_close(compiled.params(), eager.params(), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        compiled.copy().compute_update(_data(16)), eager.copy().compute_update(_data(16)), rtol=0, atol=1e-6
    )


def test_worker_replicas_compile_too() -> None:
    """The setting travels in the blueprint: every worker's replica compiles with it (the counting backend sees
    the workers' graphs), and averaging with compiled workers equals eager workers."""
    shards = [[_data(16, seed=s) for s in range(3)], [_data(16, seed=10 + s) for s in range(3)]]
    settings = {"averaging_frequency": 2, "save_updater": True}
    eager, compiled = _net(), _net(compile="torchspark_test_counting")
    assert NetworkBlueprint.of(compiled).build().compile == "torchspark_test_counting"
    fit_in_process(eager, "averaging", settings, shards)
    before = len(COMPILED)
    fit_in_process(compiled, "averaging", settings, shards)
    assert len(COMPILED) - before >= 2 * 3  # both workers' training forwards ran compiled
    torch.testing.assert_close(compiled.params(), eager.params(), rtol=0, atol=1e-6)


# ------------------------------------------------------------------ saving: no _orig_mod. keys, either way round
def test_saved_weights_have_plain_keys_and_load_compiled_or_not(tmp_path) -> None:
    data = _data(32)
    compiled = _net(compile="aot_eager").fit(data, batch_size=16)
    compiled.save(str(tmp_path / "c"))
    weights = load_file(str(tmp_path / "c" / "weights.safetensors"))
    plain = _net()
    assert sorted(weights) == sorted(plain.module.state_dict()) and not any("_orig_mod" in k for k in weights)
    loaded = Network.load(str(tmp_path / "c"))
    assert loaded.compile == "aot_eager" and isinstance(loaded.forward_module, CompiledForward)
    plain.module.load_state_dict(weights)  # into an uncompiled network
    torch.testing.assert_close(plain.output(data.features), compiled.output(data.features), rtol=0, atol=1e-6)
    plain.save(str(tmp_path / "p"))
    back = _net(compile="eager")
    back.module.load_state_dict(load_file(str(tmp_path / "p" / "weights.safetensors")))  # and the other way
    torch.testing.assert_close(back.output(data.features), plain.output(data.features), rtol=0, atol=1e-6)
    assert Network.load(str(tmp_path / "p")).compile is False
    assert compiled.copy().compile == "aot_eager"


# ------------------------------------------------------------------ a backend that cannot run here
def test_a_backend_failing_at_first_use_is_a_setup_error_naming_it_and_the_fix() -> None:
    net = _net(compile="torchspark_test_no_compiler")  # a known name: accepted at construction
    with pytest.raises(
        SetupError,
        match=r"torch.compile backend 'torchspark_test_no_compiler'.*failed on this "
        r"machine.*No working C\+\+ compiler.*compile=False, or compile='aot_eager'",
    ):
        net.fit(_data(16), batch_size=16)
    with pytest.raises(SetupError, match="torchspark_test_no_compiler"):
        net.output(_data(16).features)  # inference goes through the compiled forward too


@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("clang++") is None,
    reason="the inductor backend needs a C++ compiler on CPU and none is on PATH",
)
def test_inductor_when_a_compiler_is_present() -> None:
    data = _data(32)
    eager, compiled = _net(), _net(compile="inductor")
    eager.fit(data, batch_size=16)
    compiled.fit(data, batch_size=16)
    torch.testing.assert_close(compiled.params(), eager.params(), rtol=1e-5, atol=1e-5)
