"""Shipping this Python environment to Spark executors as a packed virtualenv (``spark.archives``).

Spark's "Python Package Management" guide gives three routes: a packed conda env (conda-pack), a packed
virtualenv (venv-pack) or a PEX file. torchspark uses the venv route, in three steps:

1. [`build_environment`][torchspark.shipping.build_environment] makes a fresh venv holding the installed distributions that ``torchspark`` (or any
   ``roots``) needs, copied from the running interpreter's environment — no download, and editable installs
   (``pip install -e``, which venv-pack refuses) become ordinary copies. ``pyspark`` is left out by default:
   Spark puts its own ``pyspark.zip`` first on every Python worker's ``PYTHONPATH``, so a pyspark inside the
   archive is never imported there and would only add ~500 MB.
2. [`pack_environment`][torchspark.shipping.pack_environment] packs it with venv-pack into a ``.tar.gz``.
3. [`archive_conf`][torchspark.shipping.archive_conf] gives the Spark settings that ship the archive and make executors run its interpreter.

What travels and what does not (venv-pack's rule): the archive holds every installed package, but not the
Python interpreter itself — ``bin/python`` is a symlink to the base interpreter this venv was made from. Every
executor host needs that Python (same version) at the same path, as on a cluster built from one image; else pass
``python_prefix`` (e.g. ``"/usr"``) to point the link at the nodes' own Python of the same version, or use a
conda-pack or PEX environment that carries an interpreter.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import sys
import time
import venv
from collections.abc import Iterable
from pathlib import Path

from torchspark.errors import ConfigError, SetupError

__all__ = ["TORCH_BUILD_ONLY", "BuiltEnvironment", "build_environment", "pack_environment", "archive_conf"]

# Spark unpacks these with the shell's tar/unzip (Utils.unpack); venv-pack writes the first three.
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".zip")
_ALIAS = re.compile(r"^[A-Za-z0-9_.-]+$")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")

#: torch's C++ headers and its compiled test programs: needed to build extensions and run torch's own tests,
#: never to train (~145 MB of a ~1.2 GB environment); pass as ``pack_environment(..., exclude=TORCH_BUILD_ONLY)``
TORCH_BUILD_ONLY = ("lib/python*/site-packages/torch/include/*", "lib/python*/site-packages/torch/test/*")


@dataclasses.dataclass(frozen=True)
class BuiltEnvironment:
    """A venv made by [`build_environment`][torchspark.shipping.build_environment].

    Attributes:
        prefix: the venv's directory.
        site_packages: its ``lib/pythonX.Y/site-packages``.
        distributions: the distributions copied into it (normalized names, sorted).
        size_bytes: bytes of the copied files.
    """

    prefix: Path
    site_packages: Path
    distributions: tuple[str, ...]
    size_bytes: int


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(dist: md.Distribution) -> list[tuple[str, bool]]:
    """(name, conditional) for each requirement of ``dist`` outside extras; ``conditional`` when it has a marker
    (``; sys_platform == ...``): such a requirement is taken only when it is installed."""
    out = []
    for req in dist.requires or []:
        spec, _, marker = req.partition(";")
        if "extra" in marker:
            continue  # optional extras are not part of what the package needs to run
        match = _REQ_NAME.match(spec)
        if match:
            out.append((_normalize(match.group(1)), bool(marker.strip())))
    return out


def _closure(roots: Iterable[str], exclude: set[str]) -> dict[str, md.Distribution]:
    found: dict[str, md.Distribution] = {}
    todo = [(_normalize(r), False) for r in roots]
    while todo:
        name, conditional = todo.pop()
        if name in found or name in exclude:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            if conditional:
                continue
            raise SetupError(
                f"{name!r} is needed by the environment to ship but is not installed in {sys.prefix}; "
                f"install it (pip install {name}) or add it to exclude"
            ) from None
        found[name] = dist
        todo.extend(_requirement_names(dist))
    return found


def _place(src: Path, dst: Path) -> int:
    """Hard-link ``src`` to ``dst`` (a copy when on another file system); returns its size."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst.stat().st_size


def _editable_roots(dist: md.Distribution) -> list[Path]:
    """Source directories of the top-level packages of an editable install."""
    roots = []
    for top in (dist.read_text("top_level.txt") or "").split():
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.origin:
            raise SetupError(f"editable distribution {dist.metadata['Name']!r}: cannot find its package {top!r}")
        origin = Path(spec.origin)
        roots.append(origin.parent if origin.name == "__init__.py" else origin)
    return roots


def _copy_distribution(dist: md.Distribution, site: Path) -> int:
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    info_dir = Path(str(dist._path))  # type: ignore[attr-defined]  # PathDistribution: its .dist-info folder
    size = 0
    if direct.get("dir_info", {}).get("editable"):
        # 1. an editable install points at a source tree: copy its packages, as a regular install would have
        for root in _editable_roots(dist):
            if root.is_file():
                size += _place(root, site / root.name)
                continue
            for path in root.rglob("*"):
                if path.is_file():  # compiled __pycache__ too: see below
                    size += _place(path, site / root.name / path.relative_to(root))
        for path in info_dir.iterdir():
            if path.is_file() and path.name not in ("RECORD", "direct_url.json"):
                size += _place(path, site / info_dir.name / path.name)
        return size
    # 2. a regular install: every file its RECORD lists inside site-packages (scripts in bin/ are not needed),
    #    with the compiled .pyc files: without them every executor's first `import torch` compiles thousands of
    #    modules (minutes on a busy node); they stay valid because links and tar keep the sources' mtimes
    for rel in dist.files or []:
        parts = Path(str(rel)).parts
        if not parts or parts[0] == "..":
            continue
        src = Path(str(dist.locate_file(rel)))
        if src.is_file():
            size += _place(src, site / Path(*parts))
    return size


def build_environment(
    prefix: str | os.PathLike,
    roots: Iterable[str] = ("torchspark",),
    exclude: Iterable[str] = ("pyspark",),
) -> BuiltEnvironment:
    """Make a fresh venv at ``prefix`` with ``roots`` and everything they need, copied from this environment.

    Args:
        prefix: directory of the new venv; must not exist yet.
        roots: distributions to ship with their requirements (extras left out): ``("torchspark", "my-app")``.
        exclude: distributions to leave out, with what only they need. ``pyspark`` by default (the cluster's
            Spark provides it to every Python worker); pass ``()`` to keep it.
    Returns:
        the [`BuiltEnvironment`][torchspark.shipping.BuiltEnvironment]. Files are hard links into this environment where the file system allows,
        so building costs seconds and little disk.
    Raises:
        ConfigError: ``prefix`` exists. SetupError: a required distribution is not installed here.
    """
    prefix = Path(prefix).absolute()
    if prefix.exists():
        raise ConfigError(f"prefix {str(prefix)!r} already exists; pass a new directory")
    dists = _closure(roots, {_normalize(e) for e in exclude})
    # the base interpreter (not this venv's symlink), so the new venv does not depend on this one
    venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
    site = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    size = sum(_copy_distribution(d, site) for d in dists.values())
    return BuiltEnvironment(prefix, site, tuple(sorted(dists)), size)


def pack_environment(
    prefix: str | os.PathLike,
    output: str | os.PathLike,
    compress_level: int = 1,
    python_prefix: str | None = None,
    exclude: Iterable[str] = (),
) -> Path:
    """Pack the venv at ``prefix`` into ``output`` (``.tar.gz``/``.tgz``/``.zip``) with venv-pack.

    Args:
        prefix: a venv without editable installs (e.g. from [`build_environment`][torchspark.shipping.build_environment]).
        output: the archive to write (written under a temporary name, then renamed).
        compress_level: gzip level 0-9. 1 packs a torch environment several times faster than venv-pack's
            default 4 for an archive only a little larger; the archive is compressed once and unpacked on every
            executor, so raise it when the upload link is slow.
        python_prefix: where the executors' Python lives when not at this base interpreter's path (``"/usr"``).
        exclude: venv-pack file patterns (relative to ``prefix``, shell wildcards) to leave out, e.g.
            [`TORCH_BUILD_ONLY`][torchspark.shipping.TORCH_BUILD_ONLY]: C++ headers and test binaries torch does not need at run time (~150 MB).
    Raises:
        ConfigError: a bad suffix or level. SetupError: venv-pack is not installed.
    """
    output = Path(output).absolute()
    if not str(output).endswith(_ARCHIVE_SUFFIXES):
        raise ConfigError(f"output must end with one of {_ARCHIVE_SUFFIXES} (Spark unpacks those), got {str(output)!r}")
    if isinstance(compress_level, bool) or not isinstance(compress_level, int) or not 0 <= compress_level <= 9:
        raise ConfigError(f"compress_level must be an integer in 0..9, got {compress_level!r}")
    try:
        import venv_pack
    except ImportError as e:
        raise SetupError("packing needs venv-pack: pip install 'torchspark[deploy]' (or pip install venv-pack)") from e
    suffix = next(s for s in _ARCHIVE_SUFFIXES if str(output).endswith(s))
    tmp = output.with_name(f".{output.name}.{os.getpid()}.{time.monotonic_ns()}{suffix}")
    try:
        venv_pack.pack(
            prefix=str(prefix),
            output=str(tmp),
            compress_level=compress_level,
            python_prefix=python_prefix,
            force=True,
            filters=[("exclude", p) for p in exclude],
        )
        os.chmod(tmp, 0o644)  # venv-pack's temp file is private; the archive is meant to be uploaded and shared
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return output


def archive_conf(archive: str, alias: str = "environment") -> dict[str, str]:
    """Spark settings that ship ``archive`` to every executor and name its interpreter for the Python workers.

    Args:
        archive: the packed environment: a local path, or a URL every node can read (``hdfs://``, ``s3a://``).
        alias: the directory it is unpacked to in each executor's working directory.
    Returns:
        ``spark.archives`` (``archive#alias``; Spark unpacks it on every executor, and on the driver in client
        mode; ``spark.yarn.dist.archives`` is the YARN-only equivalent) and ``spark.pyspark.python``
        (``./alias/bin/python``, relative to the executor's working directory). ``spark-submit`` turns the latter
        into the workers' interpreter; in client mode also pass ``spark.pyspark.driver.python`` (the driver's
        own Python: the archive is not unpacked in the driver's working directory). A driver started as a plain
        ``python app.py`` reads the workers' interpreter only from the ``PYSPARK_PYTHON`` environment variable
        when its session starts: set ``os.environ["PYSPARK_PYTHON"]`` to the same value first.
    """
    if not str(archive).endswith(_ARCHIVE_SUFFIXES):
        raise ConfigError(f"archive must end with one of {_ARCHIVE_SUFFIXES}, got {archive!r}")
    if not _ALIAS.match(alias):
        raise ConfigError(f"alias must be a plain directory name (letters, digits, '._-'), got {alias!r}")
    return {"spark.archives": f"{archive}#{alias}", "spark.pyspark.python": f"./{alias}/bin/python"}
