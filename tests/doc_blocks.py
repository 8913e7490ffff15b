"""The runnable code blocks of the documentation: README.md and every page under docs/.

A block is runnable when the line before its opening fence is ``<!-- runnable -->`` (an HTML comment: invisible
on GitHub and on the site). The fence must be a ```python block; a marker before anything else is an error, so a
block cannot silently stop running. Blocks of one page run in order in one namespace (a later block may use what
an earlier one defined), as a reader would paste them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MARKER", "ROOT", "Block", "doc_files", "runnable_blocks", "blocks_by_page"]

ROOT = Path(__file__).resolve().parents[1]
#: the line that marks the next code block as runnable
MARKER = "<!-- runnable -->"
_FENCE = re.compile(r"^(`{3,})(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    """One runnable block: its page (relative to the repository), the line of its marker, its code."""

    page: str
    line: int
    code: str


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every markdown page under docs/ (docs/incoming/ included: its blocks run before the move)."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def runnable_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The runnable blocks of one markdown file, in order.

    Raises:
        ValueError: a marker not followed by a ```python fence, or a fence that never closes.
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    page = str(path.relative_to(root))
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence is None or fence.group(2) != "python":
            raise ValueError(
                f"{page}:{i + 1}: {MARKER} must be followed by a ```python block, got "
                f"{lines[i + 1] if i + 1 < len(lines) else 'the end of the file'!r}"
            )
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == fence.group(1)), None)
        if end is None:
            raise ValueError(f"{page}:{i + 2}: the runnable block's fence never closes")
        blocks.append(Block(page, i + 1, "\n".join(lines[i + 2 : end]) + "\n"))
    return blocks


def blocks_by_page(root: Path = ROOT) -> dict[str, list[Block]]:
    """Every page that has runnable blocks, with its blocks in order."""
    pages = {}
    for path in doc_files(root):
        blocks = runnable_blocks(path, root)
        if blocks:
            pages[blocks[0].page] = blocks
    return pages
