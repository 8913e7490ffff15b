"""The extraction of runnable documentation blocks (tests/doc_blocks.py): what counts, what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from doc_blocks import MARKER, blocks_by_page, python_blocks, runnable_blocks, unaccounted_blocks

PAGE = f"""# A page

```python
print("not marked: never run")
```

{MARKER}
```python
x = 1
```

text

{MARKER}
````python
y = x + 1
````
"""


def test_only_marked_python_blocks_are_extracted_in_order(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    blocks = runnable_blocks(page, tmp_path)
    assert [(b.page, b.line, b.code) for b in blocks] == [("page.md", 7, "x = 1\n"), ("page.md", 14, "y = x + 1\n")]


@pytest.mark.parametrize(
    "text, message",
    [
        (f"{MARKER}\n```bash\nls\n```\n", "```bash"),
        (f"{MARKER}\ntext\n", "'text'"),
        (f"{MARKER}\n", "''"),
        (f"{MARKER}\n```python\nx = 1\n", "never closes"),
    ],
)
def test_a_marker_that_runs_nothing_is_an_error(tmp_path: Path, text: str, message: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as err:
        runnable_blocks(page, tmp_path)
    assert "page.md:" in str(err.value)


def test_every_marker_in_the_repository_is_well_formed() -> None:
    pages = blocks_by_page()  # raises on a malformed marker
    assert "README.md" in pages


ACCOUNTED = f"""# A page

{MARKER}
```python
x = 1
```

> **Not run by the tests:** needs a YARN cluster.

```python
spark = yarn()
```

- an item:

  {MARKER}
  ```python
  def f():
      return x
  ```

```bash
echo not python: not counted
```

```python
forgotten = True
```
"""


def test_each_python_block_runs_says_why_not_or_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(ACCOUNTED)
    assert python_blocks(page, tmp_path) == [(4, "runs"), (10, "needs a YARN cluster."), (17, "runs"), (26, "")]
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(ACCOUNTED)
    assert unaccounted_blocks(tmp_path) == ["README.md:26"]


def test_a_runnable_block_inside_a_list_item_is_dedented(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(ACCOUNTED)
    assert [b.code for b in runnable_blocks(page, tmp_path)] == ["x = 1\n", "def f():\n    return x\n"]


def test_every_python_block_of_the_docs_runs_or_says_why_not() -> None:
    missing = unaccounted_blocks()
    assert not missing, (
        f"```python blocks with neither `{MARKER}` on the line above (tests/spark/test_doc_examples.py runs it) "
        f"nor a visible reason (`> **Not run by the tests:** why.` above it): {missing}"
    )
