"""Configuration files: training masters and ``torchspark train`` settings as YAML or JSON.

* Masters: [`master_to_yaml`][torchspark.config_files.master_to_yaml] / [`master_from_yaml`][torchspark.config_files.master_from_yaml] (and ``master.to_yaml()`` /
  ``TrainingMaster.from_yaml``) write and read the same mapping as ``to_json()``; [`save_master`][torchspark.config_files.save_master] /
  [`load_master`][torchspark.config_files.load_master] pick the format from the file name (``.yaml``/``.yml`` or ``.json``).
* ``torchspark train --config run.yaml``: the file holds the train options by name (``epochs: 4``,
  ``training_mode: averaging``, ``batch_size_per_worker: 32``; dashes or underscores); options given on the command line
  override it. ``--print-config`` prints the settings a command would train with, to start such a file.

YAML needs the ``[yaml]`` extra (PyYAML). Files are read with PyYAML's *safe* loader: plain mappings, lists,
strings and numbers only; a tag that would build a Python object (``!!python/object``) is refused. The loader
also reads ``1e-4`` as a number (YAML 1.2; PyYAML's YAML 1.1 would read it as a string). Parsing and writing the
mappings is [`torchspark._io.load_mapping`][torchspark._io.load_mapping] / [`dump_mapping`][torchspark._io.dump_mapping] (the masters' YAML
methods use them too), re-exported here.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
from typing import Any

from torchspark._io import atomic_write_bytes, check_regular_file, dump_mapping, load_mapping
from torchspark.errors import ConfigError
from torchspark.training.config.masters import TrainingMaster, master_from_json

__all__ = [
    "load_mapping",
    "dump_mapping",
    "master_to_yaml",
    "master_from_yaml",
    "save_master",
    "load_master",
    "TRAIN_SETTINGS_EXCLUDED",
    "train_settings",
    "load_train_settings",
    "apply_train_config",
    "command_settings",
    "load_command_settings",
    "parse_with_config",
]

YAML_SUFFIXES = (".yaml", ".yml")
#: train options that are about this invocation, not the run's settings
TRAIN_SETTINGS_EXCLUDED = ("command", "config", "print_config")


def _is_yaml(path: str) -> bool:
    return os.fspath(path).lower().endswith(YAML_SUFFIXES)


#: the largest configuration file read (a master or train settings file is a few KiB of text)
MAX_CONFIG_BYTES = 1 << 20


def _read(path: str) -> str:
    """The file's text, read at most [`MAX_CONFIG_BYTES`][torchspark.config_files.MAX_CONFIG_BYTES] (``/dev/zero`` or a huge file is never slurped); a
    FIFO, device or directory is refused before it is read (a FIFO would block the read until a writer comes)."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns at once, and fstat then refuses it (no race with a stat)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ConfigError(f"cannot read the configuration file {path!r}: {e}") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        check_regular_file(path, ConfigError, "configuration file")  # names what it is
        raise ConfigError(f"the configuration file {path!r} is not a regular file: pass the path of a file")
    with os.fdopen(fd, "rb") as f:
        try:
            blob = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as e:
            raise ConfigError(f"cannot read the configuration file {path!r}: {e}") from e
    if len(blob) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"the configuration file {path!r} is larger than {MAX_CONFIG_BYTES >> 20} MiB: a "
            "configuration is a small YAML or JSON text file; check the path"
        )
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"the configuration file {path!r} is not UTF-8 text (binary data at byte {e.start}): "
            "pass a YAML or JSON text file"
        ) from None
    if "\x00" in text:
        raise ConfigError(
            f"the configuration file {path!r} holds NUL bytes (binary data): pass a YAML or JSON text file"
        )
    return text


# ------------------------------------------------------------------ training masters
def master_to_yaml(master: TrainingMaster) -> str:
    """The master's ``to_dict()`` (with its ``type``) as YAML; [`master_from_yaml`][torchspark.config_files.master_from_yaml] reads it back
    (``master.to_yaml()``)."""
    return master.to_yaml()


def master_from_yaml(text: str) -> TrainingMaster:
    """Rebuild any training master from YAML (the mapping ``to_json()`` writes, as YAML;
    ``TrainingMaster.from_yaml(text)``)."""
    return TrainingMaster.from_yaml(text)


def save_master(master: TrainingMaster, path: str) -> None:
    """Write ``master`` to ``path``: YAML for ``.yaml``/``.yml``, else JSON (written to a temp name, then renamed)."""
    text = master_to_yaml(master) if _is_yaml(path) else master.to_json() + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), ConfigError)


def load_master(path: str) -> TrainingMaster:
    """Read a master written by [`save_master`][torchspark.config_files.save_master] (or by hand): YAML for ``.yaml``/``.yml``, else JSON."""
    text = _read(path)
    return master_from_json(json.dumps(load_mapping(text, "yaml" if _is_yaml(path) else "json", path)))


# ------------------------------------------------------------------ `torchspark train` settings
def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:  # argparse keeps subcommands only in its private list of actions
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise ConfigError(f"the parser has no {command!r} command")


def _settable(sub: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        a.dest: a
        for a in sub._actions
        if a.dest not in TRAIN_SETTINGS_EXCLUDED and a.dest != "help" and a.option_strings
    }


def train_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The settings of a parsed ``train`` command as a plain mapping (what ``--config`` reads back)."""
    return command_settings(parser, "train", args)


def command_settings(parser: argparse.ArgumentParser, command: str, args: argparse.Namespace) -> dict[str, Any]:
    """The settings of a parsed ``command`` (``train``, ``evaluate``, ...) as a plain mapping (what ``--config``
    reads back)."""
    out: dict[str, Any] = {}
    for dest in _settable(_subparser(parser, command)):
        value = getattr(args, dest)
        out[dest] = list(value) if isinstance(value, tuple) else value
    return out


def _convert(action: argparse.Action, key: str, value: Any, source: str) -> Any:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
        return value
    if value is None:
        if action.default is None:
            return None
        raise ConfigError(f"{source}: {key} needs a value (default {action.default!r}); remove the line to use it")
    if isinstance(value, (dict, list)):
        raise ConfigError(f"{source}: {key} must be a single value, got {value!r}")
    try:  # the command line's own converter, so a file and the command line accept the same values
        converted = action.type(str(value)) if callable(action.type) else str(value)
    except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
        raise ConfigError(f"{source}: {key}: {e}") from None
    if action.choices is not None and converted not in action.choices:
        raise ConfigError(f"{source}: {key} must be one of {list(action.choices)}, got {value!r}")
    return converted


def load_train_settings(parser: argparse.ArgumentParser, path: str) -> dict[str, Any]:
    """Read and validate a ``--config`` file against the ``train`` options.

    Raises:
        ConfigError: unreadable file, an unknown option (the message lists the known ones) or a bad value (the
            message names the option and what it takes).
    """
    return load_command_settings(parser, "train", path)


def load_command_settings(parser: argparse.ArgumentParser, command: str, path: str) -> dict[str, Any]:
    """Read and validate a ``--config`` file against the options of ``command`` (``train``, ``evaluate``, ...).

    Raises:
        ConfigError: unreadable file, an unknown option (the message lists the known ones) or a bad value (the
            message names the option and what it takes).
    """
    data = load_mapping(_read(path), "yaml" if _is_yaml(path) else "json", path)
    actions = _settable(_subparser(parser, command))
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in actions:
            raise ConfigError(f"{path}: unknown {command} option {raw_key!r}; known: {sorted(actions)}")
        out[key] = _convert(actions[key], key, value, path)
    return out


def apply_train_config(
    parser: argparse.ArgumentParser, argv: list[str] | None, args: argparse.Namespace
) -> argparse.Namespace:
    """``args`` with the ``--config`` file's settings under the command line's: the file's values become the
    ``train`` defaults and ``argv`` is parsed again (so an option typed on the command line wins)."""
    if getattr(args, "command", None) != "train" or not getattr(args, "config", None):
        return args
    _subparser(parser, "train").set_defaults(**load_train_settings(parser, args.config))
    return parser.parse_args(argv)


def parse_with_config(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv`` with the settings of its ``--config`` file (any subcommand that has the option) under the
    command line's: the file's values become the subcommand's defaults and ``argv`` is parsed again, so an option
    typed on the command line wins. A required option (``predict --model``) may come from the file. Options of a
    mutually exclusive group (``--verbose``/``--quiet``/``--log-level``) count as one: when the command line sets
    any of them, the file's values for the group are dropped.

    Raises:
        ConfigError: the file cannot be read, or names an unknown option or a bad value.
        SystemExit: argparse's own usage errors (code 2), ``--help``.
    """
    subs = _subparsers(parser)
    required = [a for sub in subs.values() for a in sub._actions if a.required]
    for action in required:  # the first pass only finds --config: a required option may be in the file
        action.required = False
    try:
        first = parser.parse_args(argv)
    finally:
        for action in required:
            action.required = True
    path = getattr(first, "config", None)
    command = getattr(first, "command", None)
    if not path or command not in subs:
        return parser.parse_args(argv)
    sub = subs[command]
    settings = load_command_settings(parser, command, path)
    for group in sub._mutually_exclusive_groups:
        dests = [a.dest for a in group._group_actions]
        if any(getattr(first, d) != sub.get_default(d) for d in dests):
            settings = {k: v for k, v in settings.items() if k not in dests}
    sub.set_defaults(**settings)
    restore = [a for a in sub._actions if a.required and a.dest in settings]
    for action in restore:
        action.required = False
    try:
        return parser.parse_args(argv)
    finally:
        for action in restore:
            action.required = True


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subcommands only in its private list of actions
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
