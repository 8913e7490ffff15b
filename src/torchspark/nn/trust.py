"""Which functions a saved file may name: no code runs because a data or config file says so.

A saved network's ``config.json`` names its module factory (``"torchspark.models:lenet"``) and may name custom
loss functions (``"mypkg.losses:focal"``). Importing and calling whatever a file names would let a downloaded model
run ``"os:system"``, so loading resolves names through a `CodePolicy`:

1. torchspark's own zoo (`ZOO_FACTORIES`, the paths of [`torchspark.nn.zoo.ZOO`][torchspark.models.ZOO]) is always allowed;
2. functions the caller passes (``Network.load(path, factories=[build])``) are allowed under their import path
   (``f"{fn.__module__}:{fn.__qualname__}"``, exactly what [`from_factory`][torchspark.from_factory] records), or under
   the names of a ``{"pkg.mod:build": build}`` mapping;
3. anything else is imported only with ``trust_code=True`` (the caller vouches for the file).

Registries elsewhere (updaters, schedules, threshold policies, training masters, evaluations, batch kinds) map a
file's ``"type"`` to a class through a dict and never import, so a hostile name there is just an unknown name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from torchspark.errors import ConfigError, SerializationError
from torchspark.nn.spec import attach_spec, import_object
from torchspark.nn.zoo import ZOO, ZOO_MODULE, zoo_path
from torchspark.validation import check_bool

__all__ = ["CodePolicy", "ZOO_FACTORIES", "import_path_of", "code_policy", "build_from_spec"]

#: import paths of the zoo's factories, as their specs record them (``"torchspark.models:mlp"``)
ZOO_FACTORIES: tuple[str, ...] = tuple(zoo_path(name) for name in ZOO)

Factories = Union[Iterable[Callable[..., Any]], Mapping[str, Callable[..., Any]], None]


def import_path_of(fn: Callable[..., Any]) -> str:
    """``"package.module:qualname"`` of a function: the name [`from_factory`][torchspark.from_factory] records."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname:
        raise ConfigError(f"factories must be functions with an import path (a module and a name), got {fn!r}")
    return f"{module}:{qualname}"


def _zoo(path: str) -> Callable[..., Any] | None:
    module, _, name = path.partition(":")
    return ZOO.get(name) if module == ZOO_MODULE else None


@dataclass(frozen=True)
class CodePolicy:
    """What a file may make us call: the zoo, the caller's ``factories``, or anything with ``trust_code``.

    Args:
        factories: import path -> function the caller allows (build it with `code_policy`).
        trust_code: import and call any ``"pkg.mod:fn"`` a file names. Only for files you trust as you trust
            code: a hostile file could name ``"os:system"``.
    """

    factories: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    trust_code: bool = False

    def __post_init__(self) -> None:
        check_bool("trust_code", self.trust_code)

    def resolve(self, path: Any, what: str, source: str) -> Callable[..., Any]:
        """The function a file names as ``path``.

        Args:
            path: the ``"package.module:function"`` read from the file.
            what: what the name is for, in messages (``"module factory"``, ``"loss function"``).
            source: the file, in messages.
        Raises:
            SerializationError: the name is not allowed (nothing was imported), or not a valid import path.
        """
        if not isinstance(path, str) or ":" not in path:
            raise SerializationError(
                f"{source} names the {what} {path!r}, which is not an import path "
                "'package.module:function'; the file is damaged or not a torchspark model"
            )
        found = _zoo(path) or self.factories.get(path)
        if found is not None:
            return found
        if not self.trust_code:
            allowed = sorted({*ZOO_FACTORIES, *self.factories})
            raise SerializationError(
                f"{source} names the {what} {path!r}, which is neither in torchspark's zoo nor among the factories "
                f"passed (allowed: {allowed}); loading it would import and run code named by a file. Pass the "
                f"function yourself (Network.load(path, factories=[{path.rpartition(':')[2]}])), or "
                "trust_code=True if you trust this file as you trust code"
            )
        try:
            return import_object(path)
        except ConfigError as e:
            raise SerializationError(f"{source}: {e}") from e


def code_policy(factories: Factories = None, trust_code: bool = False) -> CodePolicy:
    """A `CodePolicy` from what ``Network.load`` accepts: a list of functions (named by their import
    path) or a ``{"pkg.mod:fn": fn}`` mapping, and ``trust_code``."""
    if factories is None:
        allowed: dict[str, Callable[..., Any]] = {}
    elif isinstance(factories, Mapping):
        allowed = dict(factories)
        bad = [k for k, v in allowed.items() if not isinstance(k, str) or not callable(v)]
        if bad:
            raise ConfigError(f"factories must map 'pkg.mod:fn' names to functions; bad entries: {bad}")
    elif isinstance(factories, (str, bytes)) or not isinstance(factories, Iterable):
        raise ConfigError(f"factories must be a list of functions or a {{'pkg.mod:fn': fn}} mapping, got {factories!r}")
    else:
        allowed = {}
        for fn in factories:
            if not callable(fn):
                raise ConfigError(f"factories must be functions, got {fn!r}")
            allowed[import_path_of(fn)] = fn
    return CodePolicy(allowed, trust_code)


def build_from_spec(
    spec: dict[str, Any], policy: CodePolicy | None = None, source: str = "the module spec"
) -> torch.nn.Module:
    """Rebuild a module from [`module_spec`][torchspark.nn.module_spec] output, calling only what ``policy`` allows.

    A module saved by its class (`torchspark.nn.spec.class_spec`: a ``"rebuild"`` entry) is built as
    ``Class(**kwargs)`` under the same policy, unless its ``"rebuild"`` is ``"none"`` (arguments not recorded).

    Args:
        spec: ``{"factory": "pkg.mod:fn", "kwargs": {...}}``.
        policy: which factories may be called (`CodePolicy`); default: only
            torchspark's zoo. A spec read from a file must never import what the file names unchecked.
        source: where the spec came from, in messages.

    Raises:
        SerializationError: no factory entry, a factory the policy does not allow (or that cannot be imported), a
            class saved without the arguments it needs, or kwargs that are not an object; the message says to pass
            ``module=`` where the module is a class of the user's.

    Example: ``build_from_spec({"factory": "torchspark.models:mlp", "kwargs": {"n_in": 4, "hidden": 8,
    "n_out": 3}})`` builds the zoo's MLP; ``{"factory": "os:system", ...}`` raises SerializationError.
    """
    if not isinstance(spec, dict) or "factory" not in spec:
        raise SerializationError(f"{source}: module spec {spec!r} has no 'factory' entry")
    kwargs = spec.get("kwargs", {})
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise SerializationError(
            f"{source}: the kwargs of module factory {spec['factory']!r} must be a JSON object, got {kwargs!r}"
        )
    name = str(spec["factory"]).rpartition(":")[2] or "MyNet"
    instead = f"pass the module yourself, built as it was saved: Network.load(path, module={name}(...))"
    if spec.get("rebuild") == "none":
        raise SerializationError(
            f"{source}: the module {spec['factory']!r} cannot be rebuilt from the file alone: "
            f"{spec.get('reason', 'its constructor arguments were not recorded')}. To load these weights, {instead}"
        )
    try:
        factory = (policy or CodePolicy()).resolve(spec["factory"], "module factory", source)
    except SerializationError as e:
        if "rebuild" not in spec:  # a zoo or from_factory spec: the message says what to pass
            raise
        raise SerializationError(f"{e}; or {instead}") from e
    try:
        module = factory(**kwargs)
    except (TypeError, ConfigError) as e:
        raise SerializationError(
            f"{source}: module factory {spec['factory']!r} refused its kwargs {kwargs!r}: {e}"
        ) from e
    if not isinstance(module, torch.nn.Module):
        raise SerializationError(
            f"{source}: factory {spec['factory']!r} returned {type(module).__name__}, expected a torch.nn.Module"
        )
    if "rebuild" in spec:  # a class saved by its import path: it records its own call (or not), as it did
        return module
    return attach_spec(module, spec["factory"], kwargs)
