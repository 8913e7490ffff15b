"""Every runnable block of README.md and the guides runs (tests/doc_blocks.py says which blocks are runnable).

The blocks of one page run in order in one namespace, in a fresh working directory (they may write files such as
``model-dir``), on the suite's shared ``local[2]`` session: a block's ``local_session(cores=2)`` returns it
(``getOrCreate``), and ``spark`` is also predefined for blocks that use a session without making one.
"""

from __future__ import annotations

import traceback

import pytest

from doc_blocks import Block, blocks_by_page


def _distinct(pages: dict[str, list[Block]]) -> dict[str, list[Block]]:
    """Pages whose blocks another page already has (docs/index.md repeats the README's quick start) run once."""
    seen: set[tuple[str, ...]] = set()
    kept = {}
    for page, blocks in pages.items():
        code = tuple(block.code for block in blocks)
        if code not in seen:
            seen.add(code)
            kept[page] = blocks
    return kept


PAGES = _distinct(blocks_by_page())


def test_the_readme_and_the_guides_have_runnable_blocks() -> None:
    assert "README.md" in PAGES
    assert any(page.startswith("docs/guides/") for page in PAGES)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_runnable_blocks_run(page: str, spark, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"doc_{page}", "spark": spark}
    for block in PAGES[page]:
        try:
            exec(compile(block.code, f"{block.page}:{block.line}", "exec"), namespace)  # noqa: S102
        except Exception:  # noqa: BLE001 - any failure fails the test, with the page and line
            pytest.fail(f"the runnable block at {block.page}:{block.line} failed:\n{traceback.format_exc()}")
