"""The training masters are plain training configuration: no Spark needed, one validation path for the mesh."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchspark.errors import ConfigError
from torchspark.training import MeshConfig, ParameterAveragingTrainingMaster, SharedTrainingMaster, master_from_json

MESH = MeshConfig(
    port=40000,
    network_mask="10.0.0.0/16",
    controller_address="10.0.0.5",
    rendezvous_via="barrier",
    rendezvous_timeout_s=42.0,
    shared_memory_allreduce=False,
)


@pytest.mark.parametrize("cls", [ParameterAveragingTrainingMaster, SharedTrainingMaster])
def test_both_masters_take_every_mesh_option_flat_and_as_one_config(cls) -> None:
    flat = cls(**MESH.to_dict())
    assert flat.mesh == MESH
    assert cls().with_mesh(MESH) == flat
    again = master_from_json(flat.to_json())
    assert again == flat and again.mesh == MESH
    assert MeshConfig.from_dict(MESH.to_dict()) == MESH


@pytest.mark.parametrize("cls", [ParameterAveragingTrainingMaster, SharedTrainingMaster])
@pytest.mark.parametrize(
    "bad, match",
    [
        ({"port": 70000}, r"port must be an integer in \[0, 65535\]"),
        ({"port": True}, "port must be an integer"),
        ({"network_mask": "10.0.0"}, "network_mask must be a CIDR"),
        ({"controller_address": " "}, "controller_address must be a non-empty"),
        ({"rendezvous_via": "mpi"}, "rendezvous_via must be one of"),
        ({"rendezvous_timeout_s": 0}, r"rendezvous_timeout_s must be a finite number of seconds in \(0, 604800.0\]"),
        ({"shared_memory_allreduce": 1}, "shared_memory_allreduce must be True or False"),
    ],
)
def test_mesh_options_are_checked_in_one_place_for_both_masters(cls, bad: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=f"{cls.__name__}: {match}"):
        cls(**bad)
    with pytest.raises(ConfigError, match=match):
        MeshConfig(**bad)


def test_mesh_config_refuses_unknown_keys_and_non_configs() -> None:
    with pytest.raises(ConfigError, match=r"unknown mesh option\(s\) \['portt'\]"):
        MeshConfig.from_dict({"portt": 1})
    with pytest.raises(ConfigError, match="mesh must be a MeshConfig"):
        SharedTrainingMaster().with_mesh({"port": 1})  # type: ignore[arg-type]


def test_masters_import_from_torchspark_without_pyspark_and_spark_reexports_the_same_classes() -> None:
    code = (
        "import sys, torchspark; from torchspark import SharedTrainingMaster, ParameterAveragingTrainingMaster, "
        "MeshConfig, TrainingMaster, master_from_json; print('pyspark' in sys.modules, "
        "SharedTrainingMaster.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "torchspark.training.config.shared_master"]
    import torchspark
    import torchspark.spark as spark_pkg

    assert spark_pkg.SharedTrainingMaster is SharedTrainingMaster is torchspark.SharedTrainingMaster
    assert (
        spark_pkg.ParameterAveragingTrainingMaster
        is ParameterAveragingTrainingMaster
        is torchspark.ParameterAveragingTrainingMaster
    )
    for old in ("masters", "shared"):  # the compatibility shims of an unreleased 0.1.0 are gone
        with pytest.raises(ImportError):
            __import__(f"torchspark.spark.{old}")
