"""Bring your own model: a user-defined nn.Module saves without pickle (weights + its class's import path + the
arguments `torchspark.nn.capture` recorded), loads back by class under the trust rules or into a module the caller
built (``module=``), and every bad input says what to pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from own_models import MLP, CapturedMLP, DefaultMLP, WithLayer
from torchspark import DataSet, Network, datasets, optim
from torchspark.errors import ConfigError, SerializationError
from torchspark.nn import capture


def _trained(module: torch.nn.Module) -> Network:
    net = Network(module, updater=optim.Adam(lr=1e-2), seed=0)
    return net.fit(datasets.synthetic_classification(64, 4, 3, seed=1), epochs=2, batch_size=16)


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _edit(path: Path, edit) -> None:
    """Change config.json as a hand edit would (its checksums cover the other files, not itself)."""
    config = _config(path)
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def _same(a: Network, b: Network) -> None:
    assert torch.equal(a.params(), b.params()) and torch.equal(a.updater_state(), b.updater_state())
    assert (a.iteration, a.epoch) == (b.iteration, b.epoch)
    x = torch.randn(5, 4)
    assert torch.equal(a.output(x), b.output(x))


def test_a_plain_module_saves_without_pickle_and_loads_into_the_module_you_pass(tmp_path: Path) -> None:
    net = _trained(MLP(4, 8, 3))
    net.save(str(tmp_path / "m"))
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "config.json",
        "updater.safetensors",
        "weights.safetensors",
    ]
    spec = _config(tmp_path / "m")["module"]
    assert spec["factory"] == spec["class"] == "own_models:MLP" and spec["rebuild"] == "none"
    assert "requires n_in, hidden, n_out" in spec["reason"]
    with pytest.raises(SerializationError, match=r"requires n_in, hidden, n_out.*module=MLP\(\.\.\.\)"):
        Network.load(str(tmp_path / "m"), trust_code=True)  # even trusted: the sizes are unknown
    _same(Network.load(str(tmp_path / "m"), module=MLP(4, 8, 3)), net)


def test_a_captured_module_rebuilds_from_the_file_under_the_trust_rules(tmp_path: Path) -> None:
    net = _trained(CapturedMLP(4, hidden=8, dropout=0.25))
    net.save(str(tmp_path / "m"))
    spec = _config(tmp_path / "m")["module"]
    assert spec == {
        "factory": "own_models:CapturedMLP",
        "kwargs": {"n_in": 4, "hidden": 8, "dropout": 0.25},
        "class": "own_models:CapturedMLP",
        "rebuild": "captured",
    }
    # untrusted: nothing is imported, and the message names each way out
    with pytest.raises(SerializationError) as info:
        Network.load(str(tmp_path / "m"))
    for fix in ("factories=[CapturedMLP]", "trust_code=True", "module=CapturedMLP(...)"):
        assert fix in str(info.value)
    by_allow_list = Network.load(str(tmp_path / "m"), factories=[CapturedMLP])
    _same(by_allow_list, net)
    assert by_allow_list.module.dropout.p == 0.25 and by_allow_list.module.fc1.out_features == 8
    _same(Network.load(str(tmp_path / "m"), trust_code=True), net)
    # the rebuilt module records its call again: saved once more, it still rebuilds
    by_allow_list.save(str(tmp_path / "again"))
    assert _config(tmp_path / "again")["module"] == spec


def test_a_module_without_required_arguments_rebuilds_with_its_defaults(tmp_path: Path) -> None:
    net = _trained(DefaultMLP())
    net.save(str(tmp_path / "m"))
    assert _config(tmp_path / "m")["module"]["rebuild"] == "defaults"
    _same(Network.load(str(tmp_path / "m"), factories=[DefaultMLP]), net)
    # built with other sizes than its defaults: rebuilding with the defaults is refused, each tensor named
    Network(DefaultMLP(hidden=5), seed=0).save(str(tmp_path / "other"))
    with pytest.raises(SerializationError) as info:
        Network.load(str(tmp_path / "other"), factories=[DefaultMLP])
    message = str(info.value)
    assert "fc1.weight: saved [5, 4], the module has [8, 4]" in message
    assert "fc2.weight: saved [3, 5], the module has [3, 8]" in message
    assert "@torchspark.nn.capture" in message and "module=" in message


def test_module_of_the_wrong_architecture_names_each_tensor(tmp_path: Path) -> None:
    _trained(MLP(4, 8, 3)).save(str(tmp_path / "m"))
    with pytest.raises(SerializationError) as info:
        Network.load(str(tmp_path / "m"), module=MLP(4, 6, 3))
    message = str(info.value)
    for part in (
        "fc1.weight: saved [8, 4], the module has [6, 4]",
        "fc1.bias: saved [8], the module has [6]",
        "fc2.weight: saved [3, 8], the module has [3, 6]",
        "own_models:MLP",
    ):
        assert part in message
    assert "fc2.bias" not in message  # the same shape: not a mismatch
    # other names: missing and unexpected tensors, each with its shape
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with pytest.raises(SerializationError) as info:
        Network.load(str(tmp_path / "m"), module=other)
    message = str(info.value)
    assert "0.weight: missing from the file (the module has [8, 4])" in message
    assert "fc1.weight: saved [8, 4], not in the module" in message
    with pytest.raises(SerializationError, match="module= must be a torch.nn.Module"):
        Network.load(str(tmp_path / "m"), module=MLP)  # type: ignore[arg-type]


def test_a_class_that_no_longer_imports_names_its_path_and_says_pass_module(tmp_path: Path) -> None:
    _trained(CapturedMLP(4, hidden=8)).save(str(tmp_path / "m"))
    _edit(tmp_path / "m", lambda c: c["module"].update(factory="own_models_renamed:CapturedMLP"))
    with pytest.raises(SerializationError) as info:
        Network.load(str(tmp_path / "m"), trust_code=True)
    message = str(info.value)
    assert "own_models_renamed" in message and "module=CapturedMLP(...)" in message
    _edit(tmp_path / "m", lambda c: c["module"].update(factory="own_models:Gone"))
    with pytest.raises(SerializationError, match=r"has no attribute 'Gone'.*module=Gone\(\.\.\.\)"):
        Network.load(str(tmp_path / "m"), trust_code=True)
    # module= needs no import at all
    loaded = Network.load(str(tmp_path / "m"), module=CapturedMLP(4, hidden=8))
    assert loaded.module.fc1.out_features == 8


def test_capture_records_only_json_arguments_and_says_which_is_not(tmp_path: Path) -> None:
    net = Network(WithLayer(4, torch.nn.Tanh()), seed=0)
    net.save(str(tmp_path / "m"))
    spec = _config(tmp_path / "m")["module"]
    assert spec["rebuild"] == "none" and "argument 'act' (Tanh) has no JSON form" in spec["reason"]
    with pytest.raises(SerializationError, match=r"argument 'act'.*module=WithLayer\(\.\.\.\)"):
        Network.load(str(tmp_path / "m"), trust_code=True)
    loaded = Network.load(str(tmp_path / "m"), module=WithLayer(4, torch.nn.Tanh()))
    assert torch.equal(loaded.params(), net.params())
    with pytest.raises(ConfigError, match="capture decorates torch.nn.Module subclasses"):
        capture(object)  # type: ignore[type-var]


def test_a_subclass_of_a_captured_class_records_only_its_own_call() -> None:
    from torchspark.nn.spec import class_spec

    class Wider(CapturedMLP):  # not decorated: its call is not recorded (the parent's would rebuild another)
        def __init__(self, width: int) -> None:
            super().__init__(4, hidden=width)

    spec = class_spec(Wider(9))
    assert spec["rebuild"] == "none" and "requires width" in spec["reason"]
    assert class_spec(CapturedMLP(4, 7))["kwargs"] == {"n_in": 4, "hidden": 7}


def test_a_checkpointed_fit_of_your_module_saves_and_loads(tmp_path: Path) -> None:
    """ParallelWrapper with checkpoints trains a captured module of yours; the result saves and rebuilds (the
    checkpoint-resume itself is tests/unit/test_checkpoint.py's, on a user module too: InterruptingMLP)."""
    from torchspark.parallel import ParallelWrapper
    from torchspark.training import InProcessRunner

    net = Network(CapturedMLP(4, hidden=8), updater=optim.Adam(lr=1e-2), seed=0)
    data = datasets.synthetic_classification(64, 4, 3, seed=2)
    wrapper = ParallelWrapper(
        net,
        num_workers=2,
        training_mode="averaging",
        averaging_frequency=2,
        progress=False,
        runner=InProcessRunner(timeout_s=60),
        checkpoint_directory=str(tmp_path / "ckpt"),
    )
    wrapper.fit(data, epochs=2, batch_size=8, run_id="own")
    assert any((tmp_path / "ckpt" / "own").iterdir())
    net.save(str(tmp_path / "m"))
    _same(Network.load(str(tmp_path / "m"), factories=[CapturedMLP]), net)


def test_mlflow_logs_a_network_of_your_module_with_log_model(tmp_path: Path, monkeypatch) -> None:
    """log_model=True (the default) with a user-defined module: the MLflow model and torchspark's own
    pickle-free save are both logged, and the latter loads back."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from torchspark.listeners.mlflow_listener import MlflowListener
    from torchspark.parallel import ParallelWrapper
    from torchspark.training import InProcessRunner

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    listener = MlflowListener(tracking_uri=uri, experiment="own", log_stats=False)
    assert listener.log_model
    net = Network(CapturedMLP(4, hidden=8), updater=optim.Adam(lr=1e-2), seed=0)
    wrapper = ParallelWrapper(
        net, num_workers=2, progress=False, runner=InProcessRunner(timeout_s=60), training_mode="averaging"
    )
    wrapper.add_training_listener(listener)
    wrapper.fit(datasets.synthetic_classification(64, 4, 3, seed=3), epochs=1, batch_size=8)
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(listener.run_id).info.status == "FINISHED"
    logged = {a.path for a in client.list_artifacts(listener.run_id)}
    assert {"model", "torchspark-network"} <= logged
    local = client.download_artifacts(listener.run_id, "torchspark-network", str(tmp_path / "down"))
    _same(Network.load(local, factories=[CapturedMLP]), net)


def test_fit_data_of_your_module_is_unchanged_by_a_save(tmp_path: Path) -> None:
    """Saving does not touch the live network: it trains on after a save exactly as without one."""
    data = DataSet(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    a, b = _trained(MLP(4, 8, 3)), _trained(MLP(4, 8, 3))
    a.save(str(tmp_path / "m"))
    a.fit(data, batch_size=8)
    b.fit(data, batch_size=8)
    assert torch.equal(a.params(), b.params())


def test_a_network_spec_names_your_class_only_when_allowed() -> None:
    """NetworkSpec's model may be an import path: built only with the class handed over or trust_code."""
    from torchspark.nn.network_spec import NetworkSpec, is_import_path

    assert is_import_path("own_models:CapturedMLP") and not is_import_path("s3://bucket/model")
    spec = NetworkSpec("own_models:CapturedMLP", {"n_in": 4, "hidden": 5}, seed=0)
    with pytest.raises(ConfigError, match=r"names code to import.*factories=\[CapturedMLP\].*trust_code=True"):
        spec.build()
    allowed = spec.build(factories=[CapturedMLP])
    assert type(allowed.module) is CapturedMLP and allowed.module.fc1.out_features == 5
    trusted = NetworkSpec.from_json(spec.to_json()).build(trust_code=True)
    assert torch.equal(trusted.params(), allowed.params())  # the same seed
    with pytest.raises(ConfigError, match="bad kwargs"):
        NetworkSpec("own_models:CapturedMLP", {"width": 3}).build(factories=[CapturedMLP])
