"""What a user of the released package meets first: ``torchspark --version`` and ``--print-config`` on the base
install (PyYAML is a core dependency, so the YAML the printer writes is also what ``--config`` reads)."""

from __future__ import annotations

import importlib.metadata
import platform

import pytest
import yaml

import torchspark
from torchspark.cli import main


def test_version_comes_from_the_installed_metadata(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    line = capsys.readouterr().out.strip()
    version = importlib.metadata.version("torchspark")
    assert version == torchspark.__version__  # one source: the build reads torchspark.__version__
    assert line == (
        f"torchspark {version} (Python {platform.python_version()}, "
        f"torch {importlib.metadata.version('torch')}, pyspark {importlib.metadata.version('pyspark')})"
    )


def test_pyyaml_is_a_core_dependency() -> None:
    core = [r for r in importlib.metadata.requires("torchspark") or [] if "extra ==" not in r]
    assert any(r.lower().startswith("pyyaml") for r in core), core


def test_print_config_writes_yaml_that_config_reads_back(capsys, tmp_path) -> None:
    assert main(["train", "--epochs", "3", "--training-mode", "averaging", "--print-config"]) == 0
    printed = capsys.readouterr().out
    settings = yaml.safe_load(printed)
    assert settings["epochs"] == 3 and settings["training_mode"] == "averaging"
    (tmp_path / "run.yaml").write_text(printed)
    assert main(["train", "--config", str(tmp_path / "run.yaml"), "--print-config", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == settings
