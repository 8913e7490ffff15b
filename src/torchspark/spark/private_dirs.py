"""Private scratch directories for default exports: unique, 0700, never through a symlink, never left behind.

Without ``export_directory`` the training data is written as batch files on the driver's host. Those files are the
user's whole training set, so the directory that holds them is:

1. created with `tempfile.mkdtemp` (a fresh, unpredictable name, mode 0700, created with ``O_EXCL``
   semantics: a symlink or directory planted at that name makes creation fail instead of being followed);
2. marked with an owner file (driver pid, its start time, host, pid namespace) so that
3. the next run on the host removes directories whose driver is gone (killed with SIGKILL, out of memory, power
   loss): `remove_stale`;
4. removed by its [`SparkNetwork`][torchspark.spark.SparkNetwork] on ``close()``/``delete_temp_files()``, when the object is
   garbage-collected, and at interpreter exit (`remove_dirs` through ``weakref.finalize``).

Versions before these private directories exported into one shared folder, ``<base>/torchspark-export/`` (one
``<12 hex>-rdd<N>`` directory per export, no owner record), and a killed driver left its export there for good.
Having no owner to ask, `remove_legacy_exports` (also run when a private directory is made) removes this
user's such exports once nothing in them has changed for `LEGACY_MAX_AGE_S` (7 days): an old driver still
training writes nothing there after its export, so the age is the only sign left, and a week is far beyond a fit.

Nothing here imports pyspark.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import time

from torchspark._process import is_running, pid_namespace, start_time
from torchspark.errors import DataError

__all__ = [
    "PREFIX",
    "OWNER_FILE",
    "LEGACY_FOLDER",
    "LEGACY_MAX_AGE_S",
    "make_private_dir",
    "owner_record",
    "owner_gone",
    "remove_stale",
    "remove_legacy_exports",
    "remove_dirs",
]

log = logging.getLogger(__name__)

#: name prefix of every default export directory (``<spark.local.dir or temp dir>/torchspark-export-XXXXXXXX``)
PREFIX = "torchspark-export-"
#: the owner record inside each directory (JSON: pid, start, host, pidns)
OWNER_FILE = ".torchspark-owner.json"
#: the shared export folder of versions before the private directories (``<base>/torchspark-export/``)
LEGACY_FOLDER = "torchspark-export"
#: a legacy export is removed once nothing in it has been modified for this long (seconds; 7 days)
LEGACY_MAX_AGE_S = 7 * 24 * 3600.0
_LEGACY_EXPORT = re.compile(r"[0-9a-f]{12}-rdd[0-9]+")  # the old ``f"{uuid4().hex[:12]}-rdd{rdd.id()}"``


def owner_record() -> dict[str, object]:
    """This driver process as an owner record: pid, start time, host and pid namespace."""
    return {
        "pid": os.getpid(),
        "start": start_time(os.getpid()),
        "host": socket.gethostname(),
        "pidns": pid_namespace(),
    }


def owner_gone(owner: dict[str, object]) -> bool:
    """Whether the recorded driver ran on this host and no longer runs (False whenever that cannot be told)."""
    return owner.get("host") == socket.gethostname() and not _alive(owner)


def _alive(owner: dict[str, object]) -> bool:
    """Whether the recorded driver may still run (True when the record cannot tell: leave it alone)."""
    if "pidns" in owner and owner["pidns"] != pid_namespace():
        return True  # another container's pid namespace: its pids mean nothing here
    start = owner.get("start")
    return is_running(owner.get("pid"), start if isinstance(start, str) else None)  # type: ignore[arg-type]


def make_private_dir(base: str) -> str:
    """A new private directory under ``base`` (after removing stale ones there); returns its path.

    Raises:
        DataError: ``base`` does not exist or is not writable (the message names it and the setting).
    """
    remove_stale(base)
    remove_legacy_exports(base)
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)  # a spark.local.dir Spark has not created yet
        path = tempfile.mkdtemp(prefix=PREFIX, dir=base)
    except OSError as e:
        raise DataError(
            f"cannot create a private export directory under {base!r}: {e}. Set spark.local.dir (or "
            "TMPDIR) to a writable local directory, or set export_directory"
        ) from e
    fd = os.open(os.path.join(path, OWNER_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(owner_record(), f)
    return path


def _read_owner(path: str) -> dict[str, object] | None:
    try:
        fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            owner = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def remove_stale(base: str) -> list[str]:
    """Remove this user's default export directories under ``base`` whose driver process is gone.

    Only real directories (not symlinks) named `PREFIX`\\*, owned by this user, with an owner record from this
    host naming a process that no longer runs, are removed. Returns the removed paths.
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        owner = _read_owner(entry.path)
        if owner is None or not owner_gone(owner):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            log.info("removed %s, left by driver process %s that is gone", entry.path, owner.get("pid"))
            removed.append(entry.path)
    return removed


def _own_real_dir(path: str, uid: int) -> bool:
    """``path`` is a directory (not a symlink to one) owned by ``uid``."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid


def _newest_mtime(path: str) -> float | None:
    """The latest modification time of ``path`` and everything under it (symlinks not followed); None when it
    cannot all be read (then it is not judged)."""
    newest = 0.0
    failed: list[OSError] = []
    for root, dirs, files in os.walk(path, onerror=failed.append, followlinks=False):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            try:
                newest = max(newest, os.lstat(name).st_mtime)
            except OSError:
                return None
    return None if failed else newest


def remove_legacy_exports(base: str, max_age_s: float = LEGACY_MAX_AGE_S, now: float | None = None) -> list[str]:
    """Remove this user's exports under the old shared ``<base>/torchspark-export/`` untouched for ``max_age_s``.

    Only real directories (never symlinks) named like the old exports (``<12 hex>-rdd<N>``), owned by this user, in
    a real ``torchspark-export`` directory, whose newest modification (of the directory and anything in it) is
    older than ``max_age_s`` are removed; the shared folder itself goes too once it is empty. Anything else there
    (other users' exports, other names, newer exports) is left alone. Returns the removed paths.
    """
    folder = os.path.join(base, LEGACY_FOLDER)
    uid = os.getuid()
    try:  # a real directory (the shared folder may be another user's), never a symlink planted at the name
        if not stat.S_ISDIR(os.lstat(folder).st_mode) or not shutil.rmtree.avoids_symlink_attacks:
            return []
    except OSError:
        return []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    cutoff = (time.time() if now is None else now) - max_age_s
    removed: list[str] = []
    for entry in entries:
        if not _LEGACY_EXPORT.fullmatch(entry.name) or not _own_real_dir(entry.path, uid):
            continue
        newest = _newest_mtime(entry.path)
        if newest is None or newest >= cutoff:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            log.info(
                "removed %s, an export of an older torchspark unchanged for %.0f days",
                entry.path,
                (cutoff + max_age_s - newest) / 86400,
            )
            removed.append(entry.path)
    if removed and _own_real_dir(folder, uid):
        try:
            os.rmdir(folder)  # only when empty: another user's or a newer export keeps it
        except OSError:
            pass
    return removed


def remove_dirs(paths: list[str]) -> None:
    """Remove the directories in ``paths`` (which is emptied); what is already gone is skipped.

    Used as a ``weakref.finalize`` callback, so it takes the owner's list, not the owner.
    """
    while paths:
        shutil.rmtree(paths.pop(), ignore_errors=True)
