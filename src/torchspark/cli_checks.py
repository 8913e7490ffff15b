"""What the ``torchspark`` command checks before it works: outputs it can write and a master it can reach.

A run that trains for minutes and then cannot write its model, or a master URL Spark rejects with a Java stack
trace, should fail in the first second with one line (exit code 2) that names the option, the value and the fix.
Nothing here starts Spark or leaves anything behind: writability is probed with a temporary file or directory that
is removed at once.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import tempfile
from collections.abc import Callable
from urllib.parse import urlsplit

from torchspark.errors import ConfigError
from torchspark.nn.compiled import check_compile

__all__ = [
    "check_arguments",
    "check_user_data_options",
    "compile_setting",
    "check_master",
    "check_remote",
    "check_session_options",
    "check_route_options",
    "check_output_directory",
    "check_output_file",
    "check_parquet_output",
    "MASTER_CONNECT_TIMEOUT_S",
]

#: how long ``check_master`` waits for a TCP connection to a ``spark://`` or ``k8s://`` master
MASTER_CONNECT_TIMEOUT_S = 10.0

_LOCAL = re.compile(r"local(\[\s*(\*|[1-9][0-9]*)\s*(,\s*[0-9]+\s*)?\])?$")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*\]$")
_FORMS = "local, local[N], local[*], local-cluster[N,CORES,MB], spark://HOST:PORT, yarn or k8s://https://HOST:PORT"


def compile_setting(text: str) -> bool | str:
    """An argparse type: ``--compile``'s value, a torch.compile backend or mode (`check_compile`; ``true``/``false`` too, as a ``--config`` file writes them)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return check_compile(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _existing_ancestor(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _probe(directory: str, option: str, value: str) -> None:
    """Create and remove a temporary directory in ``directory`` (root ignores permission bits, so os.access is not
    enough: /proc, read-only mounts and full disks only show when something is created)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".torchspark-probe-", dir=directory))
    except OSError as e:
        raise ConfigError(
            f"{option} {value!r}: cannot write in {directory!r} ({e.strerror or e}); choose a writable location"
        ) from e


def _check_creatable(path: str, option: str, value: str) -> None:
    """``path`` does not exist: its nearest existing ancestor must be a writable directory."""
    ancestor = _existing_ancestor(path)
    if not os.path.isdir(ancestor):
        raise ConfigError(
            f"{option} {value!r}: {ancestor!r} is a file, so the path cannot be created; choose another location"
        )
    _probe(ancestor, option, value)


def check_output_directory(value: str, option: str = "--output", inner: Callable[[str], None] | None = None) -> None:
    """``value`` is (or can be created as) a writable local directory; ``inner(path)`` checks more (the model
    directory inside it). Remote URLs are left to the writer."""
    if _is_remote(value):
        return
    path = _local(value)
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise ConfigError(f"{option} {value!r} is a file, not a directory; pass a directory path")
        _probe(path, option, value)
    else:
        _check_creatable(path, option, value)
    if inner is not None:
        inner(path)


def check_output_file(value: str, option: str = "--output") -> None:
    """``value`` can be written as a file: not a directory, in a writable (or creatable) directory."""
    if _is_remote(value):
        return
    path = _local(value)
    if os.path.isdir(path):
        example = os.path.join(value, "evaluation.json")
        raise ConfigError(f"{option} {value!r} is a directory; pass a file path such as {example!r}")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(parent):
        _probe(parent, option, value)
    else:
        _check_creatable(parent, option, value)


def _overlap(path: str, other: str) -> str | None:
    """How the real path ``path`` and the real path ``other`` overlap: ``"is"``, ``"holds"`` (``other`` lies inside
    ``path``), ``"lies inside"``, or None."""
    if path == other:
        return "is"
    common = os.path.commonpath([path, other])
    if common == path:
        return "holds"
    if common == other:
        return "lies inside"
    return None


def _url_overlap(value: str, other: str) -> str | None:
    a, b = value.rstrip("/"), other.rstrip("/")
    if a == b:
        return "is"
    if b.startswith(a + "/"):
        return "holds"
    if a.startswith(b + "/"):
        return "lies inside"
    return None


def check_parquet_output(
    value: str,
    data: str | None,
    option: str = "--output",
    *,
    model: str | None = None,
    overwrite: bool = False,
) -> None:
    """``predict``'s Parquet output directory: never one that is, holds or lies inside the input ``data``, the
    ``model`` directory, the working directory or the home directory (replacing it would delete them); an existing
    non-empty directory only with ``overwrite``; not a file or a symbolic link; and writable, with its parent
    (the predictions are written to a temporary sibling and renamed into place).

    Raises:
        ConfigError: naming the option, the value, what it would delete and the fix.
    """
    inputs = [("--data", data if data and not data.startswith("digits") else None), ("--model", model)]
    if _is_remote(value):  # a URL: compared as text; Spark refuses an existing one unless --overwrite
        for name, other in inputs:
            relation = _url_overlap(value, other) if other and _is_remote(other) else None
            if relation is not None:
                raise ConfigError(
                    f"{option} {value!r} {relation} {name} {other!r}: writing the predictions there would delete "
                    f"it{' (even with --overwrite)' if overwrite else ''}; write them to a directory outside it"
                )
        return
    path = os.path.realpath(_local(value))
    for name, other in inputs:
        if other is None or _is_remote(other):
            continue
        relation = _overlap(path, os.path.realpath(_local(other)))
        if relation is not None:
            raise ConfigError(
                f"{option} {value!r} {relation} {name} {other!r}: writing the predictions there would delete "
                f"it{' (even with --overwrite)' if overwrite else ''}; write them to a directory outside it"
            )
    for name, directory in (("the working directory", os.getcwd()), ("the home directory", os.path.expanduser("~"))):
        if _overlap(path, os.path.realpath(directory)) in ("is", "holds"):
            raise ConfigError(
                f"{option} {value!r} {_overlap(path, os.path.realpath(directory))} {name} {directory!r}: replacing "
                "it would delete it; write the predictions to a new directory"
            )
    local = _local(value)
    if os.path.islink(local):
        raise ConfigError(
            f"{option} {value!r} is a symbolic link (to {os.path.realpath(local)!r}); pass the directory itself or "
            "a new path"
        )
    if os.path.isdir(local):
        entries = sorted(os.listdir(local))
        if entries and not overwrite:
            raise ConfigError(
                f"{option} {value!r} already exists and holds {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} "
                f"(e.g. {entries[0]!r}); pass --overwrite to replace it and everything in it, or choose a new "
                "directory"
            )
        _probe(os.path.dirname(path), option, value)  # the temporary sibling
    check_output_directory(value, option)


def _reachable(host: str, port: int, timeout_s: float) -> str | None:
    """None when a TCP connection to ``host:port`` opens within ``timeout_s``, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as e:
        return e.strerror or str(e)


def check_master(master: str | None, option: str = "--master", timeout_s: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """A Spark master URL of a known form, and for ``spark://``/``k8s://`` one that accepts TCP connections.

    Raises:
        ConfigError: an unknown form, a missing port, an unreachable master (after ``timeout_s`` at most per
            address), or ``yarn`` without ``HADOOP_CONF_DIR``/``YARN_CONF_DIR``.
    """
    if master is None:
        return
    if _LOCAL.match(master) or _LOCAL_CLUSTER.match(master):
        return
    if master == "yarn":
        if not (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")):
            raise ConfigError(
                f"{option} yarn needs HADOOP_CONF_DIR or YARN_CONF_DIR set to the cluster's Hadoop "
                "configuration directory"
            )
        return
    if master.startswith("spark://"):
        addresses = master[len("spark://") :].split(",")
    elif master.startswith("k8s://"):
        api = master[len("k8s://") :]
        parts = urlsplit(api if "://" in api else "https://" + api)
        addresses = [f"{parts.hostname}:{parts.port or (80 if parts.scheme == 'http' else 443)}"]
    else:
        raise ConfigError(f"{option} {master!r} is not a Spark master URL; use {_FORMS}")
    reasons = []
    for address in addresses:
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"{option} {master!r}: {address!r} is not HOST:PORT (the standalone master's default "
                "port is 7077: spark://HOST:7077)"
            )
        reason = _reachable(host.strip("[]"), int(port), timeout_s)
        if reason is None:
            return
        reasons.append(f"{address.strip()}: {reason}")
    raise ConfigError(
        f"{option} {master!r}: cannot reach the master ({'; '.join(reasons)}); check the host and port "
        "and that the master is running"
    )


def check_remote(url: str | None, option: str = "--remote", timeout_s: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """A Spark Connect URL (``sc://HOST:PORT``) whose server accepts TCP connections.

    Raises:
        ConfigError: another form, or a server that cannot be reached within ``timeout_s``.
    """
    if url is None:
        return
    parts = urlsplit(url)
    if parts.scheme != "sc" or not parts.hostname:
        raise ConfigError(
            f"{option} {url!r} is not a Spark Connect URL; use sc://HOST:PORT (the server's default port is 15002)"
        )
    reason = _reachable(parts.hostname, parts.port or 15002, timeout_s)
    if reason is not None:
        raise ConfigError(
            f"{option} {url!r}: cannot reach the Connect server ({reason}); check the host and port "
            "and that the server is running (sbin/start-connect-server.sh)"
        )


#: the options that only ``--data`` uses, as (flag, attribute)
_DATA_ONLY = (("--test-data", "test_data"), ("--test-fraction", "test_fraction"), ("--num-classes", "num_classes"))


def check_user_data_options(args: argparse.Namespace) -> None:
    """``train``'s data options agree: ``--data``'s own options only with ``--data``; ``--data`` not with a
    built-in ``--dataset``, ``--parallel`` or the token model; ``--test-fraction`` in (0, 1) and not beside
    ``--test-data``.

    Raises:
        ConfigError: naming the options and the fix.
    """
    data = getattr(args, "data", None)
    if data is None:
        for flag, name in _DATA_ONLY:
            if getattr(args, name, None) is not None:
                raise ConfigError(
                    f"{flag} applies to your own data only; add --data PATH (Parquet) or --data table:NAME, or drop "
                    f"{flag}"
                )
        return
    if args.dataset != "digits":
        raise ConfigError(f"--data {data!r} and --dataset {args.dataset} both name the training data; drop one of them")
    if getattr(args, "parallel", False):
        raise ConfigError(
            f"--data {data!r} is read by Spark, but --parallel trains local processes without Spark; drop "
            "--parallel (the session is local[--num-workers] unless --master says otherwise)"
        )
    if args.model == "text_transformer":
        raise ConfigError(
            "--model text_transformer takes token ids, which --data does not carry yet; train lenet, mlp or vgg on "
            "--data, or the transformer on --dataset keywords"
        )
    fraction = getattr(args, "test_fraction", None)
    if fraction is not None:
        if getattr(args, "test_data", None) is not None:
            raise ConfigError(
                f"--test-fraction {fraction:g} holds out part of --data, but --test-data {args.test_data!r} is "
                "the test set; drop one of them"
            )
        if not 0.0 < fraction < 1.0:
            raise ConfigError(f"--test-fraction {fraction:g} must lie between 0 and 1 (exclusive), e.g. 0.2")


def check_session_options(args: argparse.Namespace) -> None:
    """``train``'s ``--parallel``, ``--connect`` and ``--remote`` pick different ways to run: at most one; and
    ``--master`` names the cluster of a session torchspark starts, which ``--remote`` does not.

    Raises:
        ConfigError: two of them, or ``--remote`` with ``--master``.
    """
    chosen = [
        flag
        for flag, on in (
            ("--parallel", getattr(args, "parallel", False)),
            ("--connect", getattr(args, "connect", False)),
            ("--remote", getattr(args, "remote", None) is not None),
        )
        if on
    ]
    if len(chosen) > 1:
        raise ConfigError(f"{' and '.join(chosen)} pick different ways to run; use one of them")
    if getattr(args, "remote", None) is not None and getattr(args, "master", None) is not None:
        raise ConfigError(
            f"--master {args.master} names the cluster of a session torchspark starts, but --remote "
            f"{args.remote} uses a running Connect server, whose cluster is its own; drop --master"
        )


def check_route_options(args: argparse.Namespace) -> None:
    """``train`` options that only one route takes: ``--progress-directory`` a Spark Connect session (``--connect``,
    ``--remote``), as ``SparkNetwork(progress_directory=...)`` does; ``--gpus-per-worker`` a classic session on a
    cluster manager (a stage-level resource profile: not local mode, not Connect, not ``--parallel``).

    Raises:
        ConfigError: naming the option, its value, why it cannot apply and the fix.
    """
    on_connect = bool(getattr(args, "connect", False)) or getattr(args, "remote", None) is not None
    directory = getattr(args, "progress_directory", None)
    if directory is not None and not on_connect:
        route = "--parallel's local processes" if getattr(args, "parallel", False) else "a classic Spark session"
        raise ConfigError(
            f"--progress-directory {directory!r} applies to a Spark Connect session only (--connect or --remote): "
            f"with {route} the workers stream progress to this process over TCP; add --connect or --remote, or "
            "drop --progress-directory"
        )
    gpus = getattr(args, "gpus_per_worker", None)
    if gpus is None:
        return
    if getattr(args, "parallel", False):
        raise ConfigError(
            f"--gpus-per-worker {gpus:g} asks Spark for GPUs per training task, but --parallel trains local "
            "processes without Spark; drop --gpus-per-worker or --parallel"
        )
    if on_connect:
        raise ConfigError(
            f"--gpus-per-worker {gpus:g} asks a stage-level resource profile, which the Spark Connect route does not "
            "attach yet; give the tasks their GPUs through the Connect server's settings "
            "(spark.executor.resource.gpu.amount, spark.task.resource.gpu.amount) and drop --gpus-per-worker"
        )
    master = getattr(args, "master", None) or f"local[{args.num_workers}]"
    if _LOCAL.match(master):
        raise ConfigError(
            f"--gpus-per-worker {gpus:g} needs stage-level scheduling, which Spark does not offer in local mode "
            f"(--master {master}); pass --master of a cluster manager whose executors own GPUs (spark://HOST:7077, "
            "yarn, k8s://..., local-cluster[N,CORES,MB]), or drop --gpus-per-worker"
        )


def _model_directory(output: str) -> None:
    from torchspark.nn.portable import check_save_target

    check_save_target(os.path.join(output, "model"), ConfigError)


def check_arguments(args: argparse.Namespace) -> None:
    """Everything the command can check before it loads data, starts Spark or trains.

    Raises:
        ConfigError: the first problem found (the CLI prints it as one line and exits with code 2, a usage error:
            `torchspark.cli_exit`).
    """
    command = args.command
    if command == "train":
        check_user_data_options(args)
        check_session_options(args)
        check_route_options(args)
        check_remote(getattr(args, "remote", None))
    if not getattr(args, "parallel", False):
        check_master(getattr(args, "master", None))
    output = getattr(args, "output", None)
    if command == "train" and output is not None:  # train's --output has a default
        check_output_directory(output, inner=_model_directory)
    elif command == "evaluate" and output:
        check_output_file(output)
    elif command == "predict" and output is not None:  # predict's --output is required
        check_parquet_output(
            output,
            getattr(args, "data", None),
            model=getattr(args, "model", None),
            overwrite=bool(getattr(args, "overwrite", False)),
        )
