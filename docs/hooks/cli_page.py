"""MkDocs hook: the command-line reference, generated from the CLI's own argparse parser at build time.

``docs/reference/cli.md`` holds the marker ``<!-- cli-help -->``; this hook replaces it with ``torchspark --help``
and every subcommand's ``--help`` (the parser ``torchspark.cli.build_parser`` builds, so a new option or command
appears on the site without anyone editing a page). tests/unit/test_docs_site.py checks the page lists every
subcommand and option.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["MARKER", "cli_markdown", "on_page_markdown"]

#: the line in a page that the generated reference replaces
MARKER = "<!-- cli-help -->"
#: the help is wrapped at this width, whatever the terminal that builds the site
HELP_COLUMNS = "100"


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


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace :data:`MARKER` in a page with :func:`cli_markdown`; other pages pass through unchanged."""
    return markdown.replace(MARKER, cli_markdown()) if MARKER in markdown else markdown
