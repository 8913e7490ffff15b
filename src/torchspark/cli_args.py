"""The command line's argument types (each a function ``text -> value`` for argparse, with a message naming the
bad value) and ``--version``'s line."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
from typing import Any

from torchspark.errors import ConfigError
from torchspark.validation import parse_float, parse_int

__all__ = [
    "int_at_least",
    "positive_int",
    "non_negative_int",
    "positive_float",
    "threshold",
    "shape",
    "json_object",
    "version_line",
]


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object (``'{"hidden": 64}'``), with a message naming the bad value."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object such as '{{\"hidden\": 64}}'")
    return value


def int_at_least(minimum: int) -> Any:
    """An argparse type: an integer >= ``minimum`` (`torchspark.validation.parse_int`), with a message naming
    the value."""

    def parse(text: str) -> int:
        try:
            return parse_int(text, minimum)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_float(text: str) -> float:
    try:
        return parse_float(text, 0)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def threshold(text: str) -> float | str:
    if text == "calibrated":
        return text
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(
            f"{e}; use 'calibrated' (the default) or a threshold > 0 such as DL4J's 1e-4"
        ) from None


def shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape such as 1,28,28") from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape such as 1,28,28")
    return dims


def version_line() -> str:
    """``torchspark --version``: this installation's version (its package metadata) and those of Python, torch
    and pyspark, the four a bug report needs (read from metadata: nothing is imported)."""

    def installed(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"torchspark {installed('torchspark')} (Python {platform.python_version()}, torch {installed('torch')}, "
        f"pyspark {installed('pyspark')})"
    )
