"""Checks of configuration values, written once: integers, numbers, booleans and choices.

Every check raises [`ConfigError`][torchspark._io.ConfigError] with one message shape, naming the option, what it takes
and the value it got::

    check_int("epochs", 0, 1)
    # ConfigError: epochs must be an integer >= 1, got 0
    check_int("checkpoint_every", 0, 1, owner="SharedTrainingMaster", allow_none=True, none_means="once per epoch")
    # ConfigError: SharedTrainingMaster: checkpoint_every must be an integer >= 1 or None (once per epoch), got 0

``bool`` is never an integer or a number here (``True`` for ``epochs`` is a mistake, not 1). Each check returns the
value it accepted, so a constructor can check and assign in one line. The CLI's text options go through
`parse_int` / `parse_float`, whose messages leave the option's name to argparse.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from torchspark.errors import ConfigError

__all__ = ["check_int", "check_float", "check_bool", "check_choice", "is_int", "is_number", "parse_int", "parse_float"]


def is_int(value: Any) -> bool:
    """``value`` is a Python ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """``value`` is a Python ``int`` or ``float`` and not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bounds(minimum: Any = None, maximum: Any = None, above: Any = None, below: Any = None) -> str:
    """``" >= 1"``, ``" > 0"``, ``" in [0, 65535]"``, ``" in (0, 1)"`` or ``""``."""
    low = f"[{minimum}" if minimum is not None else f"({above}" if above is not None else ""
    high = f"{maximum}]" if maximum is not None else f"{below})" if below is not None else ""
    if low and high:
        return f" in {low}, {high}"
    for bound, sign in ((minimum, ">="), (above, ">"), (maximum, "<="), (below, "<")):
        if bound is not None:
            return f" {sign} {bound}"
    return ""


def _refuse(
    name: str, value: Any, expected: str, owner: str, allow_none: bool, none_means: str, fix: str
) -> ConfigError:
    subject = f"{owner}: {name}" if owner else name
    if allow_none:
        expected += " or None" + (f" ({none_means})" if none_means else "")
    return ConfigError(f"{subject} must be {expected}, got {value!r}" + (f"; {fix}" if fix else ""))


def _in_range(value: Any, minimum: Any, maximum: Any, above: Any, below: Any) -> bool:
    # each bound as "value >= minimum" (not "not value < minimum"): NaN fails every comparison, so it is refused
    return (
        (minimum is None or value >= minimum)
        and (maximum is None or value <= maximum)
        and (above is None or value > above)
        and (below is None or value < below)
    )


def check_int(
    name: str,
    value: Any,
    minimum: int | None = None,
    maximum: int | None = None,
    *,
    allow_none: bool = False,
    owner: str = "",
    meaning: str = "",
    none_means: str = "",
    fix: str = "",
) -> Any:
    """``value`` if it is an integer in ``[minimum, maximum]`` (either bound may be None), else ConfigError.

    Args:
        name: the option, as the user writes it.
        value: what the user passed.
        minimum, maximum: inclusive bounds (None: unbounded on that side).
        allow_none: None is accepted (and returned) too.
        owner: the class or command the option belongs to, prefixed to the message (``"SharedTrainingMaster"``).
        meaning: a note after the bounds, such as ``"(0 = off)"``.
        none_means: what None stands for, in the message (``"infer"``).
        fix: advice appended after the value (``"10 is typical"``).
    Returns:
        ``value`` unchanged.
    Raises:
        ConfigError: ``"<owner>: <name> must be an integer >= <minimum> <meaning>[ or None (<none_means>)], got
            <value>[; <fix>]"``.

    Example: ``check_int("port", 70000, 0, 65535, meaning="(0 = any free port)")`` raises
    ``port must be an integer in [0, 65535] (0 = any free port), got 70000``.
    """
    if value is None and allow_none:
        return value
    if not is_int(value) or not _in_range(value, minimum, maximum, None, None):
        expected = "an integer" + _bounds(minimum, maximum) + (f" {meaning}" if meaning else "")
        raise _refuse(name, value, expected, owner, allow_none, none_means, fix)
    return value


def check_float(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    finite: bool = False,
    allow_none: bool = False,
    owner: str = "",
    unit: str = "",
    none_means: str = "",
    fix: str = "",
) -> Any:
    """``value`` if it is a number (``int`` or ``float``, not ``bool``) within the bounds, else ConfigError.

    Args:
        name, owner, allow_none, none_means, fix: as for `check_int`.
        minimum, maximum: inclusive bounds; ``above``, ``below``: exclusive ones (None: unbounded).
        finite: refuse NaN and infinities (any bound refuses NaN already).
        unit: what the number counts, in the message (``"seconds"``: "a number of seconds > 0").
    Returns:
        ``value`` unchanged (an ``int`` stays an ``int``).
    Raises:
        ConfigError: ``"<name> must be a [finite ]number[ of <unit>] <bounds>[ or None], got <value>[; <fix>]"``.

    Example: ``check_float("l1", -1.0, minimum=0, finite=True)`` raises
    ``l1 must be a finite number >= 0, got -1.0``.
    """
    if value is None and allow_none:
        return value
    if (
        not is_number(value)
        or (finite and not math.isfinite(value))
        or not _in_range(value, minimum, maximum, above, below)
    ):
        expected = (
            f"a {'finite ' if finite else ''}number"
            + (f" of {unit}" if unit else "")
            + _bounds(minimum, maximum, above, below)
        )
        raise _refuse(name, value, expected, owner, allow_none, none_means, fix)
    return value


def check_bool(
    name: str, value: Any, *, allow_none: bool = False, owner: str = "", none_means: str = "", fix: str = ""
) -> bool | None:
    """``value`` if it is ``True`` or ``False`` (or None with ``allow_none``), else ConfigError
    ``"<name> must be True or False[ or None (<none_means>)], got <value>"``.

    Example: ``check_bool("overlap", "yes")`` raises ``overlap must be True or False, got 'yes'``.
    """
    if value is None and allow_none:
        return value
    if not isinstance(value, bool):
        raise _refuse(name, value, "True or False", owner, allow_none, none_means, fix)
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any], *, owner: str = "", fix: str = "") -> Any:
    """``value`` if it is one of ``choices``, else ConfigError ``"<name> must be one of [...], got <value>"``.

    The choices are listed in the order given (pass ``sorted(registry)`` for a registry's names).

    Example: ``check_choice("memory_format", "nhwc", ("contiguous", "channels_last"))`` raises
    ``memory_format must be one of ['contiguous', 'channels_last'], got 'nhwc'``.
    """
    options = list(choices)
    try:
        known = value in options
    except (TypeError, ValueError):  # a value that cannot be compared with the choices (an array) is none of them
        known = False
    if not known:
        raise _refuse(name, value, f"one of {options}", owner, False, "", fix)
    return value


def parse_int(text: str, minimum: int | None = None) -> int:
    """An integer typed as text (a command-line option); the caller (argparse) names the option.

    Raises:
        ConfigError: ``"'two' is not an integer"`` or ``"must be >= 1, got 0"``.

    Example: ``parse_int("3", 1)`` is 3.
    """
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"must be >= {minimum}, got {value}")
    return value


def parse_float(text: str, above: float | None = None) -> float:
    """A number typed as text (a command-line option); the caller (argparse) names the option.

    Raises:
        ConfigError: ``"'x' is not a number"`` or ``"must be > 0, got -1"`` (NaN is never above a bound).

    Example: ``parse_float("1e-3", 0)`` is 0.001.
    """
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a number") from None
    if above is not None and not value > above:
        raise ConfigError(f"must be > {above}, got {text}")
    return value
