"""Checks that a listener's destination can be used, made when the listener is built (not an epoch into a fit).

* `check_directory`: a local directory that exists or can be created (a file in the way, a read-only
  parent or a full disk is a [`ConfigError`][torchspark._io.ConfigError] naming the path);
* `check_reachable`: an ``http(s)://`` server that accepts a TCP connection within a few seconds (an
  unreachable MLflow server would otherwise be retried inside every call for minutes).

Example::

    check_directory("runs/tb", "TensorBoardListener log_dir")
    check_reachable("http://mlflow.internal:5000", "MlflowListener tracking_uri")
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from torchspark.errors import ConfigError

__all__ = ["check_directory", "check_reachable", "CONNECT_TIMEOUT_S"]

#: how long the reachability check waits for a TCP connection
CONNECT_TIMEOUT_S = 5.0


def check_directory(path: str | os.PathLike[str], what: str) -> str:
    """Create ``path`` (and parents) if needed and return it as a string.

    Raises:
        ConfigError: it cannot be created or is not a writable directory; the message names ``what`` and the path.
    """
    path = os.fspath(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"{what} {path!r} cannot be created ({e.strerror or e}): choose a writable directory"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path!r} is not writable: choose a writable directory")
    return path


def check_reachable(url: str, what: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Open (and close) a TCP connection to the host and port of the ``http(s)://`` ``url``.

    Raises:
        ConfigError: no connection within ``timeout_s``; the message names ``what``, the URL and the reason.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            pass
    except OSError as e:
        reason = "timed out" if isinstance(e, socket.timeout) else (e.strerror or str(e))
        raise ConfigError(
            f"{what}: the server {url} is not reachable ({reason} within {timeout_s:g} s): start it, "
            "or pass the tracking_uri it listens on"
        ) from None
