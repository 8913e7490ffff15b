"""BENCHMARKS.md upkeep (benchmarks/_common.py): a run_all rewrites what it measures and keeps everything else."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture()
def common(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    module = importlib.import_module("_common")
    monkeypatch.setattr(module, "BENCHMARKS_MD", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(module, "RESULTS_DIR", tmp_path / "results")
    yield module
    sys.modules.pop("_common", None)


def test_a_run_keeps_hand_written_sections_and_the_sections_it_does_not_run(common: ModuleType) -> None:
    common.reset_benchmarks_md({"date": "run-one-date"})
    common.write_section("codec", "## Codec\n\ncodec figures v1", {"targets": []})
    common.write_section("sharing", "## Sharing\n\nsharing figures v1", {"targets": []})
    text = common.BENCHMARKS_MD.read_text()
    common.BENCHMARKS_MD.write_text(text.replace("## Caveats", "## Faults\n\nsoak figures by hand\n\n## Caveats"))

    common.reset_benchmarks_md({"date": "run-two-date"}, ["codec"])

    text = common.BENCHMARKS_MD.read_text()
    assert "soak figures by hand" in text  # a hand-written section survives
    assert "sharing figures v1" in text  # a generated section not run this time survives
    assert (common.RESULTS_DIR / "sharing.json").exists()
    assert "codec figures v1" not in text  # the section being run is reset, and its JSON removed
    assert not (common.RESULTS_DIR / "codec.json").exists()
    assert "| date | run-two-date |" in text and "run-one-date" not in text  # one machine block, the new one
    assert text.count("## Machine") == 1


def test_a_file_without_a_machine_block_starts_from_the_skeleton_keeping_the_notes(common: ModuleType) -> None:
    common.BENCHMARKS_MD.write_text(f"junk\n{common.NOTES_START}\nmy note\n{common.NOTES_END}\n")
    common.reset_benchmarks_md({"date": "now"})
    text = common.BENCHMARKS_MD.read_text()
    assert "junk" not in text and "my note" in text and "## Targets" in text


def test_a_target_that_words_its_own_verdict_keeps_it_in_the_targets_table(common: ModuleType) -> None:
    common.reset_benchmarks_md({"date": "now"})
    worded = {"target": "costs <= 5%", "measured": "-18.5% within -40.8% .. +4.5%", "met": True}
    worded["verdict"] = "**not shown to exceed 5%** (noise wider than the target)"
    common.write_section("checkpoint", "## Checkpoint\n\nfigures", {"targets": [worded]})
    common.write_section(
        "codec", "## Codec\n\nfigures", {"targets": [{"target": "fast", "measured": "1x", "met": True}]}
    )
    text = common.BENCHMARKS_MD.read_text()
    assert "| costs <= 5% | -18.5% within -40.8% .. +4.5% | **not shown to exceed 5%** (noise wider" in text
    assert "| fast | 1x | **met** |" in text
