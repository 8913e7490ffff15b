"""Atomic reads and writes on any fsspec URL (local path, ``file://``, ``memory://``, ``hdfs://``, ``s3://``), and
configuration mappings as YAML or JSON text.

Writes go to a hidden temporary name in the destination directory and are renamed into place, so a reader
never sees a half-written file and a failed write leaves nothing behind. YAML is read with PyYAML's *safe* loader
(plain mappings, lists, strings and numbers; ``1e-4`` is a number, as in YAML 1.2) and needs the ``[yaml]`` extra.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
import struct
from collections.abc import Sequence
from typing import Any

import fsspec

from torchspark._bounded import MAX_DEPTH, MAX_INT_DIGITS, depth_message, int_message, load_json
from torchspark._tmpnames import remove_abandoned, temp_name
from torchspark.errors import ConfigError

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "read_bytes",
    "check_regular_file",
    "make_dirs",
    "join",
    "filesystem",
    "read_safetensors_metadata",
    "load_mapping",
    "dump_mapping",
]


def filesystem(url: str) -> tuple[Any, str]:
    """``(fs, path)`` for a URL or local path.

    Raises:
        ConfigError: the URL's protocol is unknown to fsspec, or its backend is not installed or cannot load (the
            message names the protocol, the backend class and what it needs, e.g. ``s3fs`` for ``s3://``).
    """
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, OSError, ValueError) as e:
        raise ConfigError(_backend_advice(url, e)) from e


def _backend_advice(url: str, error: Exception) -> str:
    from fsspec.registry import known_implementations

    protocol = url.split("://", 1)[0] if "://" in url else "file"
    detail = (str(error).splitlines() or [type(error).__name__])[0]
    known = known_implementations.get(protocol)
    if known is None:
        return (
            f"{url!r}: fsspec knows no filesystem for protocol {protocol!r} ({detail}); use a local path or a "
            "URL fsspec supports (file://, hdfs://, s3://, gs://, memory:// ...)"
        )
    needs = known.get("err") or detail
    return (
        f"{url!r}: the fsspec backend for {protocol}:// ({known['class']}) is missing or cannot load: {needs}"
        f"{'' if detail == needs else f' ({detail})'}. Install it on the driver and every executor, or use a "
        "local path"
    )


def join(directory: str, name: str) -> str:
    """Join a directory URL and a file name without mangling the ``scheme://`` part."""
    return directory.rstrip("/") + "/" + name if "://" in directory else posixpath.join(directory, name)


def make_dirs(url: str, error: type[Exception], what: str = "directory") -> None:
    """Create a directory (and parents); raise ``error`` naming it when that is impossible."""
    fs, path = filesystem(url)
    try:
        fs.makedirs(path, exist_ok=True)
    except (OSError, ValueError) as e:
        raise error(f"cannot create {what} {url!r}: {e}. Choose a writable location.") from e
    if fs.exists(path) and not fs.isdir(path):
        raise error(f"{what} {url!r} exists and is not a directory. Choose another location.")


def atomic_write_bytes(url: str, data: bytes | Sequence[bytes | memoryview], error: type[Exception]) -> str:
    """Write ``data`` (bytes, or a sequence of chunks written one after the other) to ``url`` atomically (temp name,
    then rename). Raises ``error`` naming the path.

    The temporary name records the writing process (`torchspark._tmpnames`), so a write killed half-way leaves
    debris the next write of ``url`` removes."""
    fs, path = filesystem(url)
    parent, name = posixpath.split(path)
    remove_abandoned(fs, parent, name)  # what a killed earlier write of this file left (see torchspark._tmpnames)
    tmp = posixpath.join(parent, temp_name(name))
    try:
        with fs.open(tmp, "wb") as f:
            for chunk in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
                f.write(chunk)
        fs.mv(tmp, path)
    except (OSError, ValueError) as e:
        try:
            if fs.exists(tmp):
                fs.rm(tmp)
        except OSError:
            pass
        raise error(f"cannot write {url!r}: {e}. Check that the directory exists and is writable.") from e
    return url


def atomic_write_text(path: str | os.PathLike[str], text: str, error: type[Exception] = OSError) -> str:
    """Write ``text`` (UTF-8) to ``path`` (a local path or fsspec URL) as `atomic_write_bytes` does: readers
    never see a half-written file; on failure the temporary file is removed and ``error`` names the path.

    Example: ``atomic_write_text("stats.json", stats.to_json())``.
    """
    return atomic_write_bytes(os.fspath(path), text.encode("utf-8"), error)


_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def check_regular_file(
    path: str | os.PathLike[str], error: type[Exception], what: str = "file", fix: str = "pass the path of a file"
) -> None:
    """Raise ``error`` naming ``path`` (and ending with ``fix``) when it exists on local storage and is not a regular
    file (a FIFO would block the read forever, a device would never end). A missing file is left to the read that
    follows."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise error(f"the {what} {os.fspath(path)!r} is {kind}, not a regular file: {fix}")


def read_bytes(url: str, error: type[Exception]) -> bytes:
    """Read a whole file; a missing or unreadable file raises ``error`` naming it, and so does (local storage) a
    FIFO, device or directory in its place (reading one would block or never end)."""
    fs, path = filesystem(url)
    if isinstance(fs, fsspec.implementations.local.LocalFileSystem):
        check_regular_file(path, error)
    try:
        with fs.open(path, "rb") as f:
            return f.read()
    except (OSError, ValueError) as e:
        raise error(f"cannot read {url!r}: {e}") from e


def read_safetensors_metadata(blob: bytes) -> dict[str, str]:
    """The ``__metadata__`` of safetensors bytes (``{}`` when absent). Raises ValueError on a malformed header."""
    if len(blob) < 8:
        raise ValueError(f"too short for safetensors: {len(blob)} bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"safetensors header claims {n} bytes but only {len(blob) - 8} follow (truncated?)")
    header = load_json(blob[8 : 8 + n], "the safetensors header", ValueError)
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not a JSON object")
    return dict(header.get("__metadata__") or {})


def _yaml() -> Any:
    try:
        import yaml
    except ImportError as e:
        # PyYAML is a dependency of torchspark: only an install with --no-deps lacks it
        raise ConfigError(
            "YAML files need PyYAML, a dependency of torchspark missing here: pip install pyyaml "
            "(or write the file as JSON)"
        ) from e
    return yaml


def _safe_loader() -> Any:
    """PyYAML's ``SafeLoader`` (no Python objects) that also reads ``1e-4`` / ``1E+3`` as floats."""
    yaml = _yaml()

    class Loader(yaml.SafeLoader):  # type: ignore[name-defined]
        pass

    def compose_node(self: Any, parent: Any, index: Any) -> Any:
        # an alias (*name) may stand for a whole subtree: nine levels of ten aliases expand to 10**9 nodes (an
        # "anchor bomb"), so configuration files may not use them at all (refused before anything is built)
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark
            raise ConfigError(
                f"YAML aliases (*name) are not accepted in configuration files (line {mark.line + 1},"
                f" column {mark.column + 1}): write the value out in full"
            )
        # the composer recurses once per level: bounded here, before Python's stack is (a RecursionError traceback)
        depth = getattr(self, "_torchspark_depth", 0)
        if depth >= MAX_DEPTH and not self.check_event(yaml.events.ScalarEvent):
            mark = self.peek_event().start_mark
            raise ConfigError(depth_message(f"the YAML (line {mark.line + 1})"))
        self._torchspark_depth = depth + 1
        try:
            return yaml.SafeLoader.compose_node(self, parent, index)
        finally:
            self._torchspark_depth = depth

    def construct_int(self: Any, node: Any) -> Any:
        digits = len(re.sub(r"[^0-9a-fA-F]", "", str(node.value)))
        if digits > MAX_INT_DIGITS:  # int() would raise a raw ValueError past 4,300 digits, and be slow before
            raise ConfigError(int_message(f"the YAML (line {node.start_mark.line + 1})", digits))
        return yaml.SafeLoader.construct_yaml_int(self, node)

    def construct_mapping(self: Any, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:  # a key given twice would silently keep the last value
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)):
                if key in seen:
                    raise ConfigError(f"the key {key!r} appears twice (line {key_node.start_mark.line + 1}): keep one")
                seen.add(key)
        return yaml.SafeLoader.construct_mapping(self, node, deep)

    Loader.compose_node = compose_node
    Loader.construct_mapping = construct_mapping
    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""",
            re.X,
        ),
        list("-+0123456789."),
    )
    return Loader


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"the key {key!r} appears twice: keep one")
        out[key] = value
    return out


def load_mapping(text: str, fmt: str, source: str = "the configuration") -> dict[str, Any]:
    """Parse ``text`` (``fmt`` ``"yaml"`` or ``"json"``) into a mapping.

    Raises:
        ConfigError: not valid YAML/JSON, or not a mapping at the top; a key given twice in one mapping; a YAML
            alias (``*name``: refused, so an "anchor bomb" never expands); lists and mappings nested deeper than
            `MAX_DEPTH` levels or an integer longer than
            `MAX_INT_DIGITS` digits. The message names ``source``.

    Example: ``load_mapping("epochs: 4\nlr: 1e-3\n", "yaml") == {"epochs": 4, "lr": 0.001}``.
    """
    if fmt == "yaml":
        yaml = _yaml()
        try:
            data = yaml.load(text, Loader=_safe_loader())  # a SafeLoader: never builds Python objects
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(
                f"{source} is not valid YAML (plain mappings, lists, strings and numbers only): {e}"
            ) from e
    elif fmt == "json":
        try:
            data = load_json(text, source, ConfigError, object_pairs_hook=_unique_keys)
        except ConfigError as e:
            message = str(e)
            raise ConfigError(message if message.startswith(source) else f"{source}: {message}") from None
    else:
        raise ConfigError(f"configuration format must be 'yaml' or 'json', got {fmt!r}")
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a mapping of option names to values, got {type(data).__name__}")
    return data


def dump_mapping(data: dict[str, Any], fmt: str) -> str:
    """``data`` as YAML (keys in the given order) or indented JSON; [`load_mapping`][torchspark._io.load_mapping] reads it back.

    Example: ``dump_mapping({"epochs": 4}, "yaml") == "epochs: 4\n"``.
    """
    if fmt == "yaml":
        return _yaml().safe_dump(data, sort_keys=False, default_flow_style=False)
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    raise ConfigError(f"configuration format must be 'yaml' or 'json', got {fmt!r}")
