"""The runnable code blocks of the documentation: README.md and every page under docs/.

A block is runnable when the line before its opening fence is ``<!-- runnable -->`` (an HTML comment: invisible
on GitHub and on the site). The fence must be a ```python block; a marker before anything else is an error, so a
block cannot silently stop running. Blocks of one page run in order in one namespace (a later block may use what
an earlier one defined), as a reader would paste them.

Every other ```python block carries a visible reason why it does not run, on the nearest non-blank line above it:
``> **Not run by the tests:** needs a YARN cluster.`` (:data:`NOT_RUN`; a quote on GitHub and on the site). A block
with neither is an error (:func:`unaccounted_blocks`), so no example can rot unseen.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MARKER",
    "NOT_RUN",
    "ROOT",
    "Block",
    "doc_files",
    "runnable_blocks",
    "blocks_by_page",
    "python_blocks",
    "unaccounted_blocks",
]

ROOT = Path(__file__).resolve().parents[1]
#: the line that marks the next code block as runnable
MARKER = "<!-- runnable -->"
#: the visible line that says why the next ```python block does not run (the reason is group 1)
NOT_RUN = re.compile(r"^\s*> \*\*Not run by the tests:\*\* (\S.*)$")
_FENCE = re.compile(r"^(\s*)(`{3,})(\S*)\s*$")


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
        if fence is None or fence.group(3) != "python":
            raise ValueError(
                f"{page}:{i + 1}: {MARKER} must be followed by a ```python block, got "
                f"{lines[i + 1] if i + 1 < len(lines) else 'the end of the file'!r}"
            )
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == fence.group(2)), None)
        if end is None:
            raise ValueError(f"{page}:{i + 2}: the runnable block's fence never closes")
        code = textwrap.dedent("\n".join(lines[i + 2 : end]))  # a block inside a list item is indented
        blocks.append(Block(page, i + 1, code + "\n"))
    return blocks


def python_blocks(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """Every ```python block of one markdown file: (line of its fence, how it is accounted for): ``"runs"``, the
    reason it does not run, or ``""`` when it has neither the marker nor a reason."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence.group(2)), len(lines))
        if fence.group(3) == "python":
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            reason = NOT_RUN.match(above)
            if i > 0 and lines[i - 1].strip() == MARKER:
                found.append((i + 1, "runs"))
            else:
                found.append((i + 1, reason.group(1) if reason else ""))
        i = end + 1
    return found


def unaccounted_blocks(root: Path = ROOT) -> list[str]:
    """``page:line`` of every ```python block that neither runs nor says why not."""
    return [
        f"{path.relative_to(root)}:{line}"
        for path in doc_files(root)
        for line, how in python_blocks(path, root)
        if not how
    ]


def blocks_by_page(root: Path = ROOT) -> dict[str, list[Block]]:
    """Every page that has runnable blocks, with its blocks in order."""
    pages = {}
    for path in doc_files(root):
        blocks = runnable_blocks(path, root)
        if blocks:
            pages[blocks[0].page] = blocks
    return pages
