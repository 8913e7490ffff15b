"""Every public module imports, and every name its ``__all__`` promises exists."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import torchspark

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(torchspark.__path__, "torchspark.")
    if not m.name.rsplit(".", 1)[-1].startswith("_")
)


@pytest.mark.parametrize("name", MODULES)
def test_module_exports_what_all_promises(name: str) -> None:
    module = importlib.import_module(name)
    for exported in getattr(module, "__all__", []):
        assert hasattr(module, exported), f"{name}.__all__ lists {exported!r} but the module has no such name"


def test_top_level_surface() -> None:
    for name in torchspark.__all__:
        assert getattr(torchspark, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        torchspark.nope  # noqa: B018


def test_import_torchspark_does_not_import_pyspark() -> None:
    code = "import sys, torchspark, torchspark.parallel; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
