"""Every ratio and percentage in the README and the docs is a measured figure of BENCHMARKS.md (issue 43).

A figure is a number written straight before ``x`` or ``%`` (``362x``, ``0.60x``, ``~1000x``, ``0.90-2.08x``,
``-18.5%``); each number of it (both ends of a range) must occur as a figure of the same kind in the measurement
record: BENCHMARKS.md, plus the measured sections of docs/scaling.md, which BENCHMARKS.md's "Scaling" section names
as the home of its 42 rows. A figure that is not a benchmark result (a setting, a constant of the code, the test
suite's own timing) goes in ``ALLOWED`` with the reason; the allow-list is checked for entries that no longer occur.

This cannot tell which row a figure rests on (0.74x occurs in several), but it fails on a figure that no run
produced, such as the "~1000x less traffic" the README once claimed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "BENCHMARKS.md"
SCALING = ROOT / "docs" / "scaling.md"
#: docs/scaling.md from this heading on is the measurement record of bench_scaling.py (BENCHMARKS.md points to it)
SCALING_MEASURED_FROM = "## Measured on the namespace cluster"

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
#: a number (or a range of two) written straight before x or %; "2 x 4L" (a product) and "5x5" (a size) are not figures
FIGURE = re.compile(rf"(?<![\w.])[~≈]?({_NUMBER})(?:\s*(?:-|–|\.\.)\s*({_NUMBER}))?([x%])(?!\w)")

#: (page, figure as written) -> why it is not a benchmark result. Keep it short: a measured figure belongs in
#: BENCHMARKS.md, not here.
ALLOWED: dict[tuple[str, str], str] = {
    # SharedTrainingMaster's divergence check: an update whose norm is over 1000x the parameters' (a setting)
    ("docs/guides/masters.md", "1000x"): "the divergence check's bound, a constant of the code",
    # the machine's busy share while the test suite ran, recorded with the suite's timing on that page
    ("docs/contributing.md", "59%"): "the test suite's own timing, not a benchmark",
    ("docs/contributing.md", "95-100%"): "the test suite's own timing, not a benchmark",
    ("docs/contributing.md", "35-55%"): "the test suite's own timing, not a benchmark",
    # AdaptiveThreshold's default band: min_target_sparsity=1e-4 (0.01%) .. max_target_sparsity=1e-2 (1%)
    ("docs/scaling.md", "0.01%"): "AdaptiveThreshold's default band, a setting",
    # the cost model's prediction, stated as such next to the model's table (benchmarks/scaling_model.py)
    ("docs/scaling.md", "4-17%"): "the cost model's prediction, marked as the model's on the page",
}


def figures(text: str) -> list[tuple[str, str, list[str]]]:
    """``(figure as written, "x" or "%", [its numbers without thousands separators])`` for each figure in ``text``."""
    found = []
    for m in FIGURE.finditer(text):
        numbers = [n.replace(",", "") for n in m.groups()[:2] if n]
        found.append((m.group(0), m.group(3), numbers))
    return found


def measured() -> set[tuple[str, str]]:
    """Every ``(number, kind)`` that the measurement record holds as a figure."""
    scaling = SCALING.read_text(encoding="utf-8")
    assert SCALING_MEASURED_FROM in scaling, f"docs/scaling.md lost its heading {SCALING_MEASURED_FROM!r}"
    record = BENCHMARKS.read_text(encoding="utf-8") + scaling[scaling.index(SCALING_MEASURED_FROM) :]
    return {(n, kind) for _, kind, numbers in figures(record) for n in numbers}


def pages() -> dict[str, str]:
    """README.md and every page under docs/ (docs/scaling.md up to its measured sections), by relative path."""
    out = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    for path in sorted((ROOT / "docs").rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        if path == SCALING:
            text = text[: text.index(SCALING_MEASURED_FROM)]
        out[path.relative_to(ROOT).as_posix()] = text
    return out


def unmeasured(text: str, page: str, record: set[tuple[str, str]]) -> list[str]:
    """The figures of ``text`` that the record does not hold and ``ALLOWED`` does not excuse."""
    return [
        whole
        for whole, kind, numbers in figures(text)
        if (page, whole) not in ALLOWED and any((n, kind) not in record for n in numbers)
    ]


def test_every_figure_in_the_readme_and_docs_is_a_measured_one() -> None:
    record = measured()
    bad = {}
    for page, text in pages().items():
        for number, line in enumerate(text.splitlines(), 1):
            for whole in unmeasured(line, page, record):
                bad[f"{page}:{number}"] = whole
    assert not bad, (
        "figures with no BENCHMARKS.md figure behind them (write the measured figure and its condition, or, for a "
        f"setting or constant, add it to ALLOWED with the reason): {bad}"
    )


@pytest.mark.parametrize(
    "line",
    [
        "threshold-encoded gradient sharing: ~1000x less traffic",
        "typically 100-1000x less than dense exchange",
        "DL4J's fixed start gives ~50x less traffic",
    ],
)
def test_a_figure_no_run_produced_is_caught(line: str) -> None:
    assert unmeasured(line, "README.md", measured()), line


def test_measured_figures_and_non_figures_pass() -> None:
    record = measured()
    assert not unmeasured("sharing sent 362x fewer bytes than averaging every 5 steps (550x per step)", "x", record)
    assert not unmeasured("on the transformer sharing was 0.60x DDP; within 0.90-2.08x", "x", record)
    assert figures("2 x 4L bytes, conv 5x5 x20, (N,1,8,8), 1x28x28 inputs, 10 x 100") == []
    assert [w for w, _, _ in figures("~1000x, 0.90-2.08x, -18.5%, 1,302x")] == [
        "~1000x",
        "0.90-2.08x",
        "18.5%",
        "1,302x",
    ]


def test_every_allowed_figure_still_occurs_on_its_page() -> None:
    text = pages()
    stale = [key for key in ALLOWED if key[1] not in [w for w, _, _ in figures(text.get(key[0], ""))]]
    assert not stale, f"ALLOWED entries whose figure is gone from the page: remove them: {stale}"


#: "the seeds" were this project's own source documents; users read "DL4J's guidance" (its "When to use Spark" etc.)
SEEDS = re.compile(r"\bseeds'|\bthe seeds\b|\bseeds:", re.I)


def test_user_docs_say_dl4js_guidance_not_the_seeds() -> None:
    hits = [f"{page}: {m.group(0)!r}" for page, text in pages().items() for m in SEEDS.finditer(text)]
    src = ROOT / "src" / "torchspark"
    hits += [
        f"{path.relative_to(ROOT)}: {m.group(0)!r}"
        for path in sorted(src.rglob("*.py"))
        for m in SEEDS.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not hits, hits
