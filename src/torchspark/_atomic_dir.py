"""Write a whole directory at once: under a temporary sibling name, then swapped in for the old one.

Saving a model file by file over an older model can stop half-way (a full disk, Ctrl-C) and leave new weights
under the old config, which loads without error. Here a reader sees the old directory or the new one, never a mix:

1. every file is written into ``.<name>.tmp-<writer>-<random>`` next to the destination (same filesystem, so step 2
   is a rename, not a copy); any failure removes that directory and leaves the old one untouched. A killed save
   cannot remove it: the next save of the same destination removes those whose writing process is gone
   (`torchspark._tmpnames`);
2. on a local filesystem the two directories are exchanged in one step (Linux ``renameat2(RENAME_EXCHANGE)``),
   else the old one is renamed aside and the new one renamed into place (a crash between the two renames leaves
   the old model at ``.<name>.old-<random>``);
3. the old directory is removed.

On object stores (``s3://``, ``memory://``) a directory rename is a copy: the new files are complete before the old
directory is removed, but a reader in between may see no model.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import shutil
import uuid
from collections.abc import Callable, Mapping

from fsspec.implementations.local import LocalFileSystem

from torchspark._io import filesystem
from torchspark._tmpnames import remove_abandoned, temp_name

__all__ = ["write_directory"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two local paths; False when the platform or filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), b)


def _swap_local(tmp: str, path: str) -> None:
    if not os.path.lexists(path):
        os.rename(tmp, path)
        return
    if _exchange(tmp, path):  # tmp now holds the old directory
        shutil.rmtree(tmp, ignore_errors=True)  # the new model is in place either way
        return
    parent, name = os.path.split(path)
    old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex}")
    os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def write_directory(
    url: str,
    files: Mapping[str, bytes],
    error: type[Exception],
    check_existing: Callable[[list[str]], str | None] | None = None,
) -> str:
    """Make ``url`` a directory holding exactly ``files`` (name -> bytes), replacing any old one at once.

    Args:
        url: the destination directory (local path or fsspec URL).
        files: the new directory's files, written in this order.
        error: the exception class to raise (it names ``url``).
        check_existing: called with the names in an existing destination directory; returns a reason not to
            replace it (then ``error`` is raised and nothing is written), or None.
    Raises:
        error: the destination is a file, ``check_existing`` refused, or a write failed (the old directory is
            then unchanged and no temporary directory is left behind).
    """
    fs, path = filesystem(url)
    path = path.rstrip("/") or path
    parent, name = posixpath.split(path)
    local = isinstance(fs, LocalFileSystem)
    if fs.exists(path):
        if not fs.isdir(path):
            raise error(f"{url!r} exists and is not a directory; save to a directory path")
        reason = (
            check_existing([posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)])
            if check_existing
            else None
        )
        if reason:
            raise error(f"{url!r} {reason}")
    remove_abandoned(fs, parent, name)
    tmp = posixpath.join(parent, temp_name(name))
    try:
        fs.makedirs(parent, exist_ok=True)
        fs.makedirs(tmp, exist_ok=False)
        for file_name, data in files.items():
            with fs.open(posixpath.join(tmp, file_name), "wb") as f:
                f.write(data)
        if local:
            _swap_local(tmp, path)
        else:
            if fs.exists(path):
                fs.rm(path, recursive=True)
            fs.mv(tmp, path, recursive=True)
    except BaseException as e:  # a failed write or Ctrl-C: leave no temporary directory behind
        try:
            if fs.exists(tmp):
                fs.rm(tmp, recursive=True)
        except OSError:
            pass
        if not isinstance(e, (OSError, ValueError)):
            raise
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        advice = (
            "the disk is full: free space or save elsewhere"
            if full
            else "check that the parent directory exists and is writable"
        )
        raise error(f"cannot save to {url!r}: {e}; {advice}. Any model that was there is unchanged.") from e
    return url
