"""Rewrite the Sphinx roles of src/ (``:class:`~torchspark.nn.Network```) as mkdocs-autorefs cross-references.

The API reference renders docstrings as Markdown (mkdocstrings, Google style), where a Sphinx role shows as raw
text. This script rewrites every role in ``src/torchspark`` mechanically:

* a role whose target is an object the API reference renders becomes a link,
  ``[`Network`][torchspark.nn.Network]`` (``mkdocs build --strict`` fails when such a link has no target);
* any other role (a private helper, a builtin, a name it cannot resolve) becomes plain code, ```Network```.

Targets resolve the way Sphinx resolves them: relative to the enclosing class and module (``:meth:`fit```), to the
package for a leading dot (``:mod:`.wire```), or absolute (``torchspark.x.y``), through imports and inherited
members (Griffe's static view of the source, nothing is imported). What "rendered" means is read from the site's
``objects.inv``, so the script first builds the site (non-strict, into a temp dir) unless given ``--inventory``.

Re-run it after merging branches that brought new roles (idempotent; it only touches roles)::

    .venv/bin/python tests/sphinx_roles.py            # rewrite src/ in place, print what became plain code
    .venv/bin/python tests/sphinx_roles.py --check    # list the remaining roles, exit 1 if any

tests/unit/test_docs_site.py fails while any role remains (``ROLE`` is the pattern).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
#: a Sphinx role: ``:kind:`target``` or ``:kind:`title <target>```; a target may wrap onto the next line
ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|exc|obj|const):`([^`]+)`")


def build_inventory() -> set[str]:
    """The object names of the API reference: ``mkdocs build`` into a temp dir, then its ``objects.inv``."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--site-dir", out, "--config-file", str(ROOT / "mkdocs.yml")],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=900,
        )
        return read_inventory(Path(out) / "objects.inv")


def read_inventory(path: Path) -> set[str]:
    header_lines = 4
    data = path.read_bytes().split(b"\n", header_lines)[header_lines]
    return {line.split(" ", 1)[0] for line in zlib.decompress(data).decode().splitlines()}


def _member(obj: Any, name: str) -> Any:
    import griffe

    try:
        members = obj.all_members if obj.is_class else obj.members
        return members.get(name)
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _walk(obj: Any, parts: list[str]) -> Any:
    for part in parts:
        if obj is None:
            return None
        obj = _member(obj, part)
    return obj


def key_of(obj: Any) -> str | None:
    """One name per object: where it is defined, except that an inherited member keeps its class (so
    ``SparkNetwork.evaluate`` and ``EvaluationMethods.evaluate`` are different pages' entries)."""
    import griffe

    try:
        if obj.is_alias and obj.inherited:
            parent = key_of(obj.parent)
            return None if parent is None else f"{parent}.{obj.name}"
        if obj.is_alias:
            return key_of(obj.final_target)
        return obj.path
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


class Resolver:
    """Sphinx targets to the API reference's names, with Griffe's view of ``src/torchspark``."""

    def __init__(self, inventory: set[str]) -> None:
        import griffe

        self.root = griffe.load("torchspark", search_paths=[str(SRC)], resolve_aliases=False)
        self.by_key: dict[str, str] = {}
        for name in sorted(inventory, key=lambda n: (len(n), n)):  # the shortest name of an object wins
            parts = name.split(".")
            if parts[0] != "torchspark":
                continue
            key = key_of(_walk(self.root, parts[1:]) if len(parts) > 1 else self.root)
            if key is not None:
                self.by_key.setdefault(key, name)
        self._index: dict[str, list[Any]] | None = None

    def module_of(self, path: Path) -> Any:
        rel = path.relative_to(SRC).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return _walk(self.root, parts[1:]) if len(parts) > 1 else self.root

    def scopes(self, module: Any, line: int) -> list[Any]:
        """The objects enclosing ``line``, innermost first, ending with the module."""
        chain = [module]
        obj = module
        while True:
            inner = None
            for member in obj.members.values():
                if member.is_alias or member.is_module:
                    continue
                if (
                    member.lineno is not None
                    and member.endlineno is not None
                    and member.lineno <= line <= member.endlineno
                ):
                    inner = member
                    break
            if inner is None:
                break
            chain.insert(0, inner)
            obj = inner
        return chain

    def _suffix(self, dotted: str) -> Any:
        if self._index is None:
            self._index = {}
            for obj in _all_objects(self.root):
                self._index.setdefault(obj.name, []).append(obj)
        parts = dotted.split(".")
        found = [o for o in self._index.get(parts[-1], []) if o.path.endswith("." + dotted)]
        return found[0] if len(found) == 1 else None  # the one object of that name (Sphinx's fallback), or none

    def resolve(self, target: str, scopes: list[Any]) -> Any:
        if target.startswith("."):
            dots = len(target) - len(target.lstrip("."))
            module = scopes[-1]
            base = module if module.is_init_module else module.parent
            for _ in range(dots - 1):
                base = base.parent if base is not None else None
            found = _walk(base, target.lstrip(".").split(".")) if base is not None else None
            return found if found is not None else self._suffix(target.lstrip("."))
        parts = target.split(".")
        for scope in scopes:
            if _member(scope, parts[0]) is not None:
                found = _walk(scope, parts)
                if found is not None:
                    return found
        if parts[0] == "torchspark":
            found = _walk(self.root, parts[1:])
            if found is not None:
                return found
        return self._suffix(target)

    def name_in_site(self, obj: Any) -> str | None:
        key = key_of(obj)
        return None if key is None else self.by_key.get(key)


def _all_objects(obj: Any) -> Iterator[Any]:
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield member
        if member.is_module or member.is_class:
            yield from _all_objects(member)


def convert_text(text: str, path: Path, resolver: Resolver, unresolved: list[str]) -> str:
    module = resolver.module_of(path)
    out = []
    last = 0
    pattern = re.compile(ROLE.pattern.replace("[^`]+", r"[^`]+?"), re.S)
    for match in pattern.finditer(text):
        kind, body = match.group(1), match.group(2)
        body = re.sub(r"\s*\n\s*", "", body)  # a target wrapped onto the next line
        titled = re.fullmatch(r"(.*?)\s*<([^>]+)>", body, re.S)
        title, target = (titled.group(1), titled.group(2)) if titled else (None, body)
        short = target.startswith("~")
        target = target.lstrip("~")
        shown = title or (target.rsplit(".", 1)[-1] if short else target.lstrip("."))
        line = text.count("\n", 0, match.start()) + 1
        obj = resolver.resolve(target, resolver.scopes(module, line)) if module is not None else None
        name = resolver.name_in_site(obj) if obj is not None else None
        if name is None:
            why = "not in the API reference" if obj is not None else "no such object in torchspark"
            unresolved.append(f"{path.relative_to(ROOT)}:{line}: :{kind}:`{body}` -> `{shown}` ({why})")
            replacement = f"`{shown}`"
        else:
            replacement = f"[`{shown}`][{name}]"
        out.append(text[last : match.start()])
        out.append(replacement)
        last = match.end()
    out.append(text[last:])
    return "".join(out)


def remaining(root: Path = SRC) -> list[str]:
    """``path:line: role`` for every Sphinx role left under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            for match in ROLE.finditer(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
            if re.search(r":(?:class|func|meth|mod|attr|data|exc|obj|const):`[^`]*$", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()} (wraps)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list the remaining roles; exit 1 if any")
    parser.add_argument("--inventory", type=Path, help="a built site's objects.inv (default: build the site)")
    parser.add_argument("--quiet", action="store_true", help="do not list the roles that became plain code")
    args = parser.parse_args(argv)
    if args.check:
        left = remaining()
        print("\n".join(left) or "no Sphinx roles in src/")
        return 1 if left else 0
    inventory = read_inventory(args.inventory) if args.inventory else build_inventory()
    resolver = Resolver(inventory)
    unresolved: list[str] = []
    changed = 0
    for path in sorted((SRC / "torchspark").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not ROLE.search(text) and not re.search(r":(?:class|func|meth|mod|attr|data|exc):`[^`]*\n", text):
            continue
        new = convert_text(text, path, resolver, unresolved)
        if new != text:
            tmp = path.with_suffix(".py.tmp")
            tmp.write_text(new, encoding="utf-8")
            tmp.replace(path)
            changed += 1
    if not args.quiet:
        print("\n".join(unresolved))
    print(f"{changed} files rewritten; {len(unresolved)} roles became plain code (no page in the API reference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
