"""MkDocs hook: the command-line reference, generated from the CLI's own argparse parser at build time.

``docs/reference/cli.md`` holds the marker ``<!-- cli-help -->``; this hook replaces it with ``torchspark --help``
and every subcommand's ``--help`` (the parser ``torchspark.cli.build_parser`` builds, so a new option or command
appears on the site without anyone editing a page). tests/unit/test_docs_site.py checks the page lists every
subcommand and option.

The guide (``docs/guides/cli.md``) keeps its synopsis and its exit-code table as text a reader of the repository
sees too, between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``: :func:`generated_blocks` makes
them from the parser and :data:`torchspark.cli_exit.EXIT_CODES`, tests/unit/test_cli.py fails when the page
differs, and ``python docs/hooks/cli_page.py`` rewrites them.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = [
    "MARKER",
    "cli_markdown",
    "on_page_markdown",
    "cli_synopsis",
    "exit_code_table",
    "generated_blocks",
    "refresh",
]

#: the line in a page that the generated reference replaces
MARKER = "<!-- cli-help -->"
#: the help is wrapped at this width, whatever the terminal that builds the site
HELP_COLUMNS = "100"
#: the guide's synopsis is wrapped at this width
SYNOPSIS_COLUMNS = "118"
#: the guide whose generated blocks :func:`refresh` rewrites
GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "guides", "cli.md")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor for the subcommands
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_text(parser: argparse.ArgumentParser) -> str:
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        return parser.format_help()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def cli_markdown() -> str:
    """The reference: ``torchspark --help``, then one section per subcommand with its ``--help``."""
    from torchspark.cli import build_parser

    parser = build_parser()
    parts = ["## `torchspark`", "", "```text", _help_text(parser).rstrip(), "```", ""]
    for name, sub in _subparsers(parser).items():
        parts += [f"## `torchspark {name}`", "", "```text", _help_text(sub).rstrip(), "```", ""]
    return "\n".join(parts)


def cli_synopsis() -> str:
    """Every subcommand's usage line (argparse's, at :data:`SYNOPSIS_COLUMNS` columns) in a text block."""
    from torchspark.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = SYNOPSIS_COLUMNS
    try:
        usages = [
            sub.format_usage().strip().removeprefix("usage: ").replace("\n" + " " * len("usage: "), "\n")
            for sub in _subparsers(build_parser()).values()
        ]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(["```text", *usages, "```"])


def exit_code_table() -> str:
    """The table of exit codes by error class (:data:`torchspark.cli_exit.EXIT_CODES`), as Markdown."""
    from torchspark import errors
    from torchspark.cli_exit import exit_code

    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.TorchSparkError)]
    meaning = {0: "done", 1: "runtime failure", 2: "usage error", 130: "interrupted"}
    rows = ["| the command ends with | exit code | which is |", "|---|---|---|"]
    for c in classes:
        code = exit_code(c("x"))
        what = " ".join((c.__doc__ or "").strip().split("\n\n")[0].split()).replace("``", "`")
        rows.append(f"| `{c.__name__}` | {code} ({meaning[code]}) | {what} |")
    rows += [
        "| argparse's own error | 2 (usage error) | an unknown option, a bad value, a missing required option |",
        "| Ctrl-C | 130 (interrupted) | `KeyboardInterrupt`: 128 + SIGINT, as a shell reports it |",
        "| nothing | 0 (done) | the command did what it was asked |",
    ]
    return "\n".join(rows)


def generated_blocks() -> dict[str, str]:
    """The guide's generated blocks by name: ``synopsis`` and ``exit-codes``."""
    return {"synopsis": cli_synopsis(), "exit-codes": exit_code_table()}


def refresh(text: str) -> str:
    """``text`` (the guide) with every generated block replaced by its current content."""
    for name, block in generated_blocks().items():
        start, end = f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"
        head, found, rest = text.partition(start)
        if not found or end not in rest:
            raise ValueError(f"the page has no {start} ... {end} block")
        text = f"{head}{start}\n{block}\n{end}{rest.partition(end)[2]}"
    return text


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace :data:`MARKER` in a page with :func:`cli_markdown`; other pages pass through unchanged."""
    return markdown.replace(MARKER, cli_markdown()) if MARKER in markdown else markdown


if __name__ == "__main__":  # python docs/hooks/cli_page.py: rewrite the guide's generated blocks
    with open(GUIDE, encoding="utf-8") as f:
        current = f.read()
    with open(GUIDE, "w", encoding="utf-8") as f:
        f.write(refresh(current))
