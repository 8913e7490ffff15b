"""The layout's rules, checked on the source: import-linter's contracts (pyproject.toml), no module over 450 lines,
no private name imported across modules. A broken rule fails the build like any other test."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "torchspark"
MAX_LINES = 450


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_import_contracts_hold(capsys) -> None:
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    out = capsys.readouterr().out
    assert code == 0, f"import-linter contracts broken (run `lint-imports` in the repository root):\n{out}"


def test_a_module_that_imports_an_adapter_breaks_the_contracts(tmp_path, capsys) -> None:
    """The check itself works: a copy of the package where the core imports pyspark's adapter is refused."""
    import shutil

    from importlinter.cli import lint_imports

    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "torchspark", ignore=shutil.ignore_patterns("__pycache__"))
    bad = copy / "torchspark" / "training" / "hooks.py"
    bad.write_text(bad.read_text() + "\nimport torchspark.spark.network  # noqa\n")
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    import sys

    sys.path.insert(0, str(copy))
    saved = {k: v for k, v in sys.modules.items() if k == "torchspark" or k.startswith("torchspark.")}
    for k in saved:
        del sys.modules[k]
    try:
        code = lint_imports(config_filename=str(tmp_path / "pyproject.toml"), no_cache=True)
    finally:
        sys.path.remove(str(copy))
        for k in [k for k in sys.modules if k == "torchspark" or k.startswith("torchspark.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    out = capsys.readouterr().out
    assert code != 0
    assert "The core never imports the adapters" in out and "BROKEN" in out


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_is_over_450_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (limit {MAX_LINES}): split it at a seam"


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_no_private_name_is_imported_across_modules() -> None:
    """``from torchspark.x import _name`` reaches into another module's internals (a private *module*, such as
    ``torchspark._io``, is the library's own shared internals and may be imported)."""
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module or not node.module.startswith("torchspark"):
                continue
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and not _is_module(f"{node.module}.{name}"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {name}")
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)
