"""Bounded parsing of JSON read from files: a nesting depth and an integer size no configuration, model or checkpoint
file comes near, so a damaged or hostile file costs a one-line error naming it, never a ``RecursionError`` traceback
or a raw ``ValueError`` from Python's integer conversion.

Every JSON document torchspark reads from a file (``torchspark train --config``, training masters, network specs,
a saved model's ``config.json``, checkpoint manifests and rank-file records, safetensors headers) goes through
`load_json`; YAML configuration files get the same two limits in [`torchspark._io.load_mapping`][torchspark._io.load_mapping]'s loader.

Example::

    load_json('{"epochs": 4}', "run.json")      # {'epochs': 4}
    load_json("[" * 100_000, "run.json")        # ConfigError: run.json nests deeper than 64 levels ...
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from torchspark.errors import ConfigError

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "load_json", "check_depth", "depth_message", "int_message"]

#: the deepest nesting of lists and mappings accepted (a configuration or model file nests a few levels)
MAX_DEPTH = 64
#: the most digits an integer in such a file may have (a seed has 20; Python refuses 4,300 with a raw ValueError)
MAX_INT_DIGITS = 100


def depth_message(source: str) -> str:
    """The message of a file nested deeper than `MAX_DEPTH`."""
    return (
        f"{source} nests lists or mappings deeper than {MAX_DEPTH} levels (the limit for configuration, model and "
        "checkpoint files): the file is damaged or not one torchspark wrote"
    )


def int_message(source: str, digits: int) -> str:
    """The message of an integer longer than `MAX_INT_DIGITS` digits."""
    return (
        f"{source} holds an integer of {digits} digits, more than the limit of {MAX_INT_DIGITS} digits for "
        "configuration, model and checkpoint files: the file is damaged or not one torchspark wrote"
    )


def check_depth(value: Any, source: str, error: type[Exception] = ConfigError) -> None:
    """Raise ``error`` when ``value`` (parsed JSON/YAML) nests lists and mappings deeper than `MAX_DEPTH`.

    Walks iteratively, so a value too deep for Python's recursion is measured without recursing."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            raise error(depth_message(source))
        stack.extend((child, depth + 1) for child in children)


def load_json(
    text: str | bytes,
    source: str,
    error: type[Exception] = ConfigError,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """``json.loads(text)`` within `MAX_DEPTH` and `MAX_INT_DIGITS`.

    Args:
        text: the JSON document (bytes are decoded as UTF-8, as ``json.loads`` does).
        source: the file (or what the text is), in messages.
        error: the exception raised for every problem (``ConfigError``, ``SerializationError``, ...): invalid JSON
            (the decoder's message), text that is not UTF-8, too deep a nesting, too long an integer.
        object_pairs_hook: passed to ``json.loads`` (a check for keys given twice).
    Raises:
        error: naming ``source`` and, for a limit, the limit.
    """

    def parse_int(digits: str) -> int:
        if len(digits) > MAX_INT_DIGITS + 1 or len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise error(int_message(source, len(digits.lstrip("-"))))
        return int(digits)

    try:
        value = json.loads(text, parse_int=parse_int, object_pairs_hook=object_pairs_hook)
    except RecursionError:  # the C decoder recurses once per level: deeper than Python's stack allows
        raise error(depth_message(source)) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError (a subclass), the hook's own ConfigError
        if isinstance(e, error):
            raise
        raise error(f"{source} is not valid JSON ({type(e).__name__}: {e})") from e
    check_depth(value, source, error)
    return value
