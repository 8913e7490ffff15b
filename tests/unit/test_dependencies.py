"""What the package declares and imports: no undeclared-but-unused dependency."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_plotly_is_neither_declared_nor_imported() -> None:
    declared = (ROOT / "pyproject.toml").read_text() + (ROOT / "constraints.txt").read_text()
    assert "plotly" not in declared
    sources = "".join(p.read_text() for p in (ROOT / "src" / "torchspark").rglob("*.py"))
    assert not re.search(r"^\s*(import|from)\s+plotly", sources, re.MULTILINE)
