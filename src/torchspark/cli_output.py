"""How ``torchspark predict`` puts its output directory in place without deleting anything it did not write.

The writer fills a temporary sibling of the output (``.NAME.torchspark-XXXX.tmp`` in the same parent, so the
rename stays on one file system), which is then renamed into place. A new path or an empty directory is simply
replaced; an existing non-empty directory only with ``overwrite`` (moved aside first, put back if the rename fails,
and deleted once the new one is in place). When the writer fails, only the temporary sibling is removed.
`torchspark.cli_checks.check_parquet_output` has already refused an output that is, holds or lies inside the
input, the model or the working directory.

Example::

    write_directory("preds", overwrite=False, write=lambda tmp: frame.write.parquet(tmp))
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import uuid
from collections.abc import Callable

from torchspark.errors import ConfigError, SetupError

__all__ = ["write_directory", "sibling"]

log = logging.getLogger(__name__)


def sibling(path: str, kind: str) -> str:
    """A fresh hidden path next to ``path``: ``.NAME.torchspark-<random>.<kind>``."""
    parent, name = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{name}.torchspark-{uuid.uuid4().hex[:12]}.{kind}")


def write_directory(output: str, overwrite: bool, write: Callable[[str], None], option: str = "--output") -> str:
    """Have ``write(tmp)`` create a directory at a fresh temporary sibling of ``output``, then rename it to
    ``output``; returns ``output``'s absolute path.

    Raises:
        ConfigError: ``output`` became a non-empty directory while it was written and ``overwrite`` is off (the new
            directory is removed; the existing one is untouched).
        SetupError: a rename failed (the existing directory is put back).
        Whatever ``write`` raises (after removing what it wrote).
    """
    path = os.path.abspath(output[len("file://") :] if output.startswith("file://") else output)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = sibling(path, "tmp")
    try:
        write(tmp)
        _move_into_place(tmp, path, overwrite, option)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # only what this command wrote; a no-op once it was renamed
        raise
    return path


def _move_into_place(tmp: str, path: str, overwrite: bool, option: str) -> None:
    try:
        os.rename(tmp, path)  # a new path, or an empty directory (rename(2) replaces an empty one)
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise SetupError(f"{option} {path!r}: cannot rename the written directory into place ({e})") from e
    if not overwrite:
        raise ConfigError(
            f"{option} {path!r} was filled by something else while the predictions were written; it is left as it "
            "was; pass --overwrite to replace it, or choose a new directory"
        )
    old = sibling(path, "old")
    try:
        os.rename(path, old)
    except OSError as e:
        raise SetupError(f"{option} {path!r}: cannot move the existing directory aside ({e})") from e
    try:
        os.rename(tmp, path)
    except OSError as e:
        os.rename(old, path)
        raise SetupError(f"{option} {path!r}: cannot rename the written directory into place ({e})") from e
    try:
        shutil.rmtree(old)
    except OSError as e:  # the new output is in place; say what is left
        log.warning("the previous %s %r could not be removed entirely (%s); it is at %r", option, path, e, old)
