"""torchspark.validation: one message shape for every integer, number, boolean and choice check."""

from __future__ import annotations

import math

import numpy as np
import pytest

from torchspark.errors import ConfigError
from torchspark.validation import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    is_int,
    is_number,
    parse_float,
    parse_int,
)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: check_int("epochs", 0, 1), "epochs must be an integer >= 1, got 0"),
        (lambda: check_int("epochs", True, 1), "epochs must be an integer >= 1, got True"),
        (lambda: check_int("epochs", 2.0, 1), "epochs must be an integer >= 1, got 2.0"),
        (
            lambda: check_int("port", 70000, 0, 65535, meaning="(0 = any free port)"),
            "port must be an integer in [0, 65535] (0 = any free port), got 70000",
        ),
        (
            lambda: check_int("num_workers", 0, 1, allow_none=True, owner="SharedTrainingMaster"),
            "SharedTrainingMaster: num_workers must be an integer >= 1 or None, got 0",
        ),
        (
            lambda: check_int("every", -1, 1, allow_none=True, none_means="once per epoch", meaning="(rounds)"),
            "every must be an integer >= 1 (rounds) or None (once per epoch), got -1",
        ),
        (
            lambda: check_int("num_bins", 0, 1, fix="10 is typical"),
            "num_bins must be an integer >= 1, got 0; 10 is typical",
        ),
        (lambda: check_int("seed", "1", allow_none=True), "seed must be an integer or None, got '1'"),
        (lambda: check_int("depth", 9, maximum=8), "depth must be an integer <= 8, got 9"),
    ],
)
def test_check_int_names_the_option_the_bounds_and_the_value(call, message) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value) == message


def test_check_int_returns_what_it_accepts() -> None:
    assert check_int("epochs", 3, 1) == 3
    assert check_int("port", 0, 0, 65535) == 0
    assert check_int("num_workers", None, 1, allow_none=True) is None
    assert check_int("offset", -5) == -5


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: check_float("l1", -1.0, minimum=0, finite=True, fix="1e-5..1e-4 is a common start"),
            "l1 must be a finite number >= 0, got -1.0; 1e-5..1e-4 is a common start",
        ),
        (lambda: check_float("l1", math.inf, minimum=0, finite=True), "l1 must be a finite number >= 0, got inf"),
        (
            lambda: check_float("data_timeout_s", 0, above=0, unit="seconds", owner="M"),
            "M: data_timeout_s must be a number of seconds > 0, got 0",
        ),
        (lambda: check_float("timeout", math.nan, above=0), "timeout must be a number > 0, got nan"),
        (lambda: check_float("precision", 1.5, minimum=0, maximum=1), "precision must be a number in [0, 1], got 1.5"),
        (
            lambda: check_float("threshold", 1, above=0, below=1, allow_none=True),
            "threshold must be a number in (0, 1) or None, got 1",
        ),
        (lambda: check_float("lr", False, above=0), "lr must be a number > 0, got False"),
        (lambda: check_float("lr", "0.1", above=0), "lr must be a number > 0, got '0.1'"),
    ],
)
def test_check_float_names_the_option_the_bounds_and_the_value(call, message) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value) == message


def test_check_float_returns_what_it_accepts() -> None:
    assert check_float("lr", 0.1, above=0) == 0.1
    assert check_float("lr", 3, above=0) == 3 and isinstance(check_float("lr", 3, above=0), int)
    assert check_float("clip", None, above=0, allow_none=True) is None
    assert check_float("x", math.inf, minimum=0) == math.inf  # only finite=True refuses infinities


def test_check_bool_takes_only_true_and_false() -> None:
    assert check_bool("overlap", True) is True and check_bool("overlap", False) is False
    for bad in (1, 0, "yes", None):
        with pytest.raises(ConfigError, match=r"^overlap must be True or False, got "):
            check_bool("overlap", bad)
    with pytest.raises(ConfigError, match=r"^SharedTrainingMaster: overlap must be True or False, got 'yes'$"):
        check_bool("overlap", "yes", owner="SharedTrainingMaster")


def test_check_choice_lists_the_choices_in_the_order_given() -> None:
    assert check_choice("mode", "sync", ("sync", "async")) == "sync"
    with pytest.raises(ConfigError) as info:
        check_choice("memory_format", "nhwc", ("contiguous", "channels_last"))
    assert str(info.value) == "memory_format must be one of ['contiguous', 'channels_last'], got 'nhwc'"
    with pytest.raises(ConfigError, match=r"^network spec: loss must be one of \['a', 'b'\], got \[\]$"):
        check_choice("loss", [], sorted({"b": 1, "a": 2}), owner="network spec")
    with pytest.raises(ConfigError, match="must be one of"):
        check_choice("mode", np.array([1, 2]), ("sync",))  # not comparable with the choices: not one of them


def test_is_int_and_is_number_exclude_bool() -> None:
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(3) and is_number(3.5) and not is_number(False) and not is_number("3")


@pytest.mark.parametrize(("text", "minimum", "expected"), [("3", 1, 3), ("0", 0, 0), ("-2", None, -2)])
def test_parse_int_reads_integers_typed_as_text(text, minimum, expected) -> None:
    assert parse_int(text, minimum) == expected


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parse_int("two", 1), "'two' is not an integer"),
        (lambda: parse_int("0", 1), "must be >= 1, got 0"),
        (lambda: parse_float("x", 0), "'x' is not a number"),
        (lambda: parse_float("-1", 0), "must be > 0, got -1"),
        (lambda: parse_float("nan", 0), "must be > 0, got nan"),
    ],
)
def test_parse_messages_leave_the_option_name_to_the_caller(call, message) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value) == message


def test_parse_float_reads_numbers_typed_as_text() -> None:
    assert parse_float("1e-3", 0) == 1e-3
    assert parse_float("-1") == -1.0


# --- the specs' own options go through these checks (one rule: a bool is never a number) -------------------------


def _spec_cases() -> list[tuple[object, str]]:
    from torchspark import optim, schedules
    from torchspark.encoding import threshold

    return [
        (lambda: optim.SGD(lr=True), "SGD: lr must be a finite number > 0, got True"),
        (lambda: optim.SGD(lr=float("nan")), "SGD: lr must be a finite number > 0, got nan"),
        (lambda: optim.SGD(momentum=True), "SGD: momentum must be a number in [0.0, 1.0), got True"),
        (lambda: optim.SGD(momentum=0.9, nesterov="yes"), "SGD: nesterov must be True or False, got 'yes'"),
        (lambda: optim.Adam(eps=True), "Adam: eps must be a finite number > 0, got True"),
        (lambda: optim.Adam(betas=(0.9, 1.0)), "Adam: betas must be a number in [0.0, 1.0), got 1.0"),
        (lambda: optim.AdamW(amsgrad=1), "AdamW: amsgrad must be True or False, got 1"),
        (lambda: optim.AdaGrad(fused="auto"), "AdaGrad: fused must be True or False or None (automatic), got 'auto'"),
        (lambda: optim.RMSprop(alpha=False), "RMSprop: alpha must be a number in [0.0, 1.0), got False"),
        (
            lambda: schedules.StepSchedule(True, 0.5, 10),
            "StepSchedule: initial must be a finite number > 0, got True",
        ),
        (
            lambda: schedules.PolySchedule(0.1, 2.0, True),
            "PolySchedule: max_iter must be an integer >= 1, got True",
        ),
        (
            lambda: schedules.ExponentialSchedule(0.1, 0.9, unit="step"),
            "ExponentialSchedule: unit must be one of ['iteration', 'epoch'], got 'step'",
        ),
        (lambda: threshold.FixedThreshold(True), "threshold must be a finite number > 0, got True; try 1e-3"),
        (
            lambda: threshold.AdaptiveThreshold(decay_rate=True),
            "decay_rate must be a number in [0.5, 1), got True; the default",
        ),
    ]


@pytest.mark.parametrize("case", range(len(_spec_cases())))
def test_updater_schedule_and_threshold_options_use_the_shared_checks(case: int) -> None:
    call, message = _spec_cases()[case]
    with pytest.raises(ConfigError, match="^" + __import__("re").escape(message)):
        call()  # type: ignore[operator]


def test_the_updater_registry_is_public_read_only_and_what_strings_resolve_to() -> None:
    from torchspark import optim

    assert sorted(optim.UPDATERS) == ["adagrad", "adam", "adamw", "rmsprop", "sgd"]
    with pytest.raises(TypeError):
        optim.UPDATERS["mine"] = optim.SGD  # type: ignore[index]
    for name, cls in optim.UPDATERS.items():
        spec = optim.resolve_updater(name)
        assert type(spec) is cls and optim.updater_from_dict(spec.to_dict()) == spec
    # the CLI's --updater choices are the registry's names (one list), and each builds its registry class
    from torchspark.cli import _updater
    from torchspark.cli_parser import UPDATERS as CLI_UPDATERS

    assert sorted(CLI_UPDATERS) == sorted(optim.UPDATERS) and CLI_UPDATERS[0] == "adam"
    assert all(type(_updater(name, 0.5)) is optim.UPDATERS[name] for name in CLI_UPDATERS)
