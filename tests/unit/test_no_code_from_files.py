"""No code runs because a file names it: hostile configs for every loader that resolves a name from a file.

Each case in :data:`CASES` is ``(id, edit, error class, message fragment)``: reusable by the bad-input catalogue.
The hostile name is an importable module planted on ``sys.path`` that creates a marker file when imported or
called, so "nothing ran" is checked directly, and a control case shows the marker does appear when the caller
trusts the file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from torchspark import Network, models, optim
from torchspark.errors import ConfigError, DataError, SerializationError
from torchspark.evaluation import Evaluation, evaluation_from_json
from torchspark.nn import from_factory
from torchspark.training import ParameterAveragingTrainingMaster, SharedTrainingMaster, master_from_json

EVIL = "evil_ts_payload"
EVIL_SOURCE = """
import os
open(os.environ["EVIL_MARKER"] + ".imported", "w").close()

def run(*args, **kwargs):
    open(os.environ["EVIL_MARKER"] + ".called", "w").close()
    import torch
    return torch.nn.Linear(64, 10)
"""


@pytest.fixture()
def evil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable module that leaves marker files when imported or called; returns the marker prefix."""
    (tmp_path / f"{EVIL}.py").write_text(EVIL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    marker = tmp_path / "marker"
    monkeypatch.setenv("EVIL_MARKER", str(marker))
    yield marker
    sys.modules.pop(EVIL, None)


def _ran(marker: Path) -> bool:
    return EVIL in sys.modules or any(marker.parent.glob(marker.name + ".*"))


def _saved_model(root: Path) -> Path:
    path = root / "model"
    Network(models.mlp(64, 8, 10), updater=optim.Adam(lr=1e-3), seed=0).save(str(path))
    return path


def _edit_config(path: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c.__setitem__(key, value)


# (id, edit of a saved mlp's config.json, error class, fragment of the message)
MODEL_CASES: list[tuple[str, Callable[[dict[str, Any]], Any], type[Exception], str]] = [
    (
        "factory os:system",
        _set("module", {"factory": "os:system", "kwargs": {"command": "touch /tmp/pwned"}}),
        SerializationError,
        "names the module factory 'os:system', which is neither in torchspark's zoo",
    ),
    (
        "factory planted module",
        _set("module", {"factory": f"{EVIL}:run", "kwargs": {}}),
        SerializationError,
        "(Network.load(path, factories=[run])), or trust_code=True",
    ),
    (
        "factory private torchspark helper",
        _set("module", {"factory": "torchspark._io:atomic_write_bytes", "kwargs": {}}),
        SerializationError,
        "names the module factory 'torchspark._io:atomic_write_bytes'",
    ),
    (
        "factory not an import path",
        _set("module", {"factory": "system", "kwargs": {}}),
        SerializationError,
        "which is not an import path",
    ),
    (
        "factory kwargs not an object",
        _set("module", {"factory": "torchspark.models:mlp", "kwargs": ["x"]}),
        SerializationError,
        "must be a JSON object, got ['x']",
    ),
    (
        "zoo factory bad kwargs",
        _set("module", {"factory": "torchspark.models:mlp", "kwargs": {"n_in": -1}}),
        SerializationError,
        "refused its kwargs",
    ),
    ("loss planted module", _set("loss", [f"{EVIL}:run"]), SerializationError, f"names the loss function '{EVIL}:run'"),
    ("loss unknown name", _set("loss", ["softmax_of_doom"]), SerializationError, "unknown loss 'softmax_of_doom'"),
    (
        "updater hostile type",
        _set("updater", {"type": f"{EVIL}:run"}),
        SerializationError,
        f"unknown updater '{EVIL}:run'",
    ),
    ("updater not an object", _set("updater", "os:system"), SerializationError, "an updater spec must be an object"),
    (
        "lr schedule hostile type",
        _set("updater", {"type": "sgd", "lr": {"type": f"{EVIL}:run"}}),
        SerializationError,
        f"unknown schedule type '{EVIL}:run'",
    ),
    ("missing weight_decay", lambda c: c.pop("weight_decay"), SerializationError, "has no 'weight_decay' entry"),
    ("version not an integer", _set("version", "1; rm -rf"), SerializationError, "expected an integer"),
]


@pytest.mark.parametrize(("edit", "error", "fragment"), [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES])
def test_hostile_model_config_runs_nothing(tmp_path: Path, evil: Path, edit, error, fragment: str) -> None:
    path = _saved_model(tmp_path)
    _edit_config(path, edit)
    with pytest.raises(error) as info:
        Network.load(str(path))
    assert fragment in str(info.value)
    assert not _ran(evil)


def test_trust_code_does_run_the_named_factory(tmp_path: Path, evil: Path) -> None:
    """The control: the planted module is importable, and trust_code=True (or allow_pickle=True) imports it."""
    path = _saved_model(tmp_path)
    _edit_config(path, _set("module", {"factory": f"{EVIL}:run", "kwargs": {}}))
    assert not _ran(evil)
    with pytest.raises(SerializationError, match="do not fit the"):
        Network.load(str(path), trust_code=True)  # the planted factory builds another architecture
    assert (tmp_path / "marker.called").exists()


def build_small(n_out: int = 10) -> torch.nn.Module:
    """A user factory (module-level, so from_factory can record it)."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, n_out))


def focal(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(outputs, labels, reduction="none")


def test_factories_the_caller_passes_are_allowed(tmp_path: Path) -> None:
    net = Network(from_factory(f"{__name__}:build_small", n_out=10), loss=f"{__name__}:focal", seed=0)
    path = str(tmp_path / "m")
    net.save(path)
    with pytest.raises(SerializationError, match=r"factories=\[build_small\]"):
        Network.load(path)
    with pytest.raises(SerializationError, match="names the loss function"):
        Network.load(path, factories=[build_small])
    for factories in ([build_small, focal], {f"{__name__}:build_small": build_small, f"{__name__}:focal": focal}):
        loaded = Network.load(path, factories=factories)
        assert torch.equal(loaded.params(), net.params())
        assert loaded.losses[0].name == f"{__name__}:focal"
    with pytest.raises(ConfigError, match="factories must be functions"):
        Network.load(path, factories=["tests.unit:build_small"])


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"\x80\x81 binary garbage", "is not valid JSON (UnicodeDecodeError"),
        (b"\xff\xfe\x00garbage", "is not valid JSON (JSONDecodeError"),
        (b"{not json", "is not valid JSON (JSONDecodeError"),
        (b"[1, 2]", "does not hold a torchspark network"),
    ],
)
def test_config_json_that_is_not_json_is_a_serialization_error(tmp_path: Path, raw: bytes, fragment: str) -> None:
    path = _saved_model(tmp_path)
    (path / "config.json").write_bytes(raw)
    with pytest.raises(SerializationError) as info:
        Network.load(str(path))
    assert fragment in str(info.value) and "config.json" in str(info.value)


def _master_json(**changes: Any) -> str:
    d = SharedTrainingMaster(batch_size_per_worker=8).to_dict()
    d.update(changes)
    return json.dumps(d)


# (id, text given to master_from_json, fragment)
MASTER_CASES: list[tuple[str, str, str]] = [
    ("type os:system", json.dumps({"type": "os:system"}), "unknown training master type 'os:system'"),
    ("type planted module", json.dumps({"type": f"{EVIL}:run"}), f"unknown training master type '{EVIL}:run'"),
    ("type not a string", json.dumps({"type": ["averaging"]}), "unknown training master type"),
    ("not an object", json.dumps(["averaging"]), "must be an object with a 'type' field, got list"),
    (
        "unknown option",
        json.dumps({**ParameterAveragingTrainingMaster().to_dict(), "__class__": "os:system"}),
        "unknown option(s) ['__class__']",
    ),
    (
        "threshold policy hostile type",
        _master_json(threshold_algorithm={"type": f"{EVIL}:run"}),
        f"unknown threshold policy type '{EVIL}:run'",
    ),
    (
        "threshold policy type not a string",
        _master_json(threshold_algorithm={"type": ["adaptive"]}),
        "unknown threshold policy type ['adaptive']",
    ),
    (
        "residual processor hostile type",
        _master_json(residual_post_processor={"type": f"{EVIL}:run"}),
        f"unknown residual post-processor type '{EVIL}:run'",
    ),
]


@pytest.mark.parametrize(("text", "fragment"), [c[1:] for c in MASTER_CASES], ids=[c[0] for c in MASTER_CASES])
def test_hostile_master_json_runs_nothing(evil: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        master_from_json(text)
    assert fragment in str(info.value)
    assert not _ran(evil)


def _evaluation_json(**changes: Any) -> str:
    d = json.loads(Evaluation().to_json())
    d.update(changes)
    return json.dumps(d)


# (id, text given to evaluation_from_json, fragment)
EVALUATION_CASES: list[tuple[str, str, str]] = [
    ("type os:system", _evaluation_json(type="os:system"), "unknown evaluation type 'os:system'"),
    ("type planted module", _evaluation_json(type=f"{EVIL}:run"), f"unknown evaluation type '{EVIL}:run'"),
    ("type not a string", _evaluation_json(type=["Evaluation"]), "unknown evaluation type"),
    ("config smuggles a field", _evaluation_json(config={"__init__": f"{EVIL}:run"}), "malformed Evaluation JSON"),
    ("not JSON", "\udcff{", "evaluation JSON could not be decoded"),
]


@pytest.mark.parametrize(("text", "fragment"), [c[1:] for c in EVALUATION_CASES], ids=[c[0] for c in EVALUATION_CASES])
def test_hostile_evaluation_json_runs_nothing(evil: Path, text: str, fragment: str) -> None:
    with pytest.raises(SerializationError) as info:
        evaluation_from_json(text)
    assert fragment in str(info.value)
    assert not _ran(evil)


def test_hostile_batch_file_kind_runs_nothing(tmp_path: Path, evil: Path) -> None:
    from safetensors.torch import save_file

    from torchspark.data import load_batch
    from torchspark.data.batchfiles import BATCH_FORMAT, BATCH_FORMAT_VERSION

    path = tmp_path / "b.safetensors"
    save_file(
        {"features": torch.zeros(2, 2)},
        str(path),
        metadata={"format": BATCH_FORMAT, "version": BATCH_FORMAT_VERSION, "kind": f"{EVIL}:run"},
    )
    with pytest.raises(DataError, match=f"unknown kind '{EVIL}:run'"):
        load_batch(str(path))
    assert not _ran(evil)
