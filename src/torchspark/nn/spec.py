"""Module specs: how a network's architecture is written to JSON and rebuilt without pickle.

A spec is ``{"factory": "package.module:function", "kwargs": {...}}``. Zoo models attach their spec to the
module they return; :func:`from_factory` does the same for any importable factory of yours.
"""

from __future__ import annotations

import importlib
import json
from typing import TYPE_CHECKING, Any, Callable

import torch

from torchspark.errors import ConfigError, SerializationError

if TYPE_CHECKING:
    from torchspark.nn.trust import CodePolicy

__all__ = ["from_factory", "module_spec", "build_from_spec", "import_object", "SPEC_ATTR"]

SPEC_ATTR = "_torchspark_spec"


def import_object(path: str) -> Any:
    """Import ``"package.module:attr"`` (``attr`` may be dotted)."""
    if not isinstance(path, str) or ":" not in path:
        raise ConfigError(f"expected an import path 'package.module:factory', got {path!r}")
    mod_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"cannot import module {mod_name!r} of {path!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ConfigError(f"module {mod_name!r} has no attribute {attr!r} (from {path!r})") from e
    return obj


def attach_spec(module: torch.nn.Module, factory: str, kwargs: dict[str, Any]) -> torch.nn.Module:
    """Record how ``module`` was built so :meth:`Network.save` can write it as JSON."""
    try:
        json.dumps(kwargs)
    except TypeError as e:
        raise ConfigError(f"factory kwargs of {factory!r} must be JSON-serializable: {e}") from e
    setattr(module, SPEC_ATTR, {"factory": factory, "kwargs": dict(kwargs)})
    return module


def from_factory(path: str, **kwargs: Any) -> torch.nn.Module:
    """Build a module from an importable factory and remember the spec.

    Example: ``from_factory("mypkg.models:resnet_small", n_classes=10)``. The saved network then reloads
    anywhere ``mypkg`` is importable, with no pickle involved.
    """
    factory = import_object(path)
    if not callable(factory):
        raise ConfigError(f"{path!r} is not callable")
    module = factory(**kwargs)
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"factory {path!r} returned {type(module).__name__}, expected a torch.nn.Module")
    return attach_spec(module, path, kwargs)


def module_spec(module: torch.nn.Module) -> dict[str, Any] | None:
    """The JSON spec of a module built by the zoo or :func:`from_factory`, else None."""
    spec = getattr(module, SPEC_ATTR, None)
    return dict(spec) if isinstance(spec, dict) else None


def build_from_spec(spec: dict[str, Any], policy: "CodePolicy | None" = None,
                    source: str = "the module spec") -> torch.nn.Module:
    """Rebuild a module from :func:`module_spec` output.

    Args:
        spec: ``{"factory": "pkg.mod:fn", "kwargs": {...}}``.
        policy: which factories may be called (:class:`~torchspark.nn.trust.CodePolicy`); default: only
            torchspark's zoo. A spec read from a file must never import what the file names unchecked.
        source: where the spec came from, in messages.
    Raises:
        SerializationError: no factory entry, a factory the policy does not allow, or kwargs that are not an
            object.
    """
    from torchspark.nn.trust import CodePolicy

    if not isinstance(spec, dict) or "factory" not in spec:
        raise SerializationError(f"{source}: module spec {spec!r} has no 'factory' entry")
    kwargs = spec.get("kwargs", {})
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise SerializationError(f"{source}: the kwargs of module factory {spec['factory']!r} must be a JSON "
                                 f"object, got {kwargs!r}")
    factory = (policy or CodePolicy()).resolve(spec["factory"], "module factory", source)
    try:
        module = factory(**kwargs)
    except (TypeError, ConfigError) as e:
        raise SerializationError(f"{source}: module factory {spec['factory']!r} refused its kwargs {kwargs!r}: "
                                 f"{e}") from e
    if not isinstance(module, torch.nn.Module):
        raise SerializationError(f"{source}: factory {spec['factory']!r} returned {type(module).__name__}, "
                                 "expected a torch.nn.Module")
    return attach_spec(module, spec["factory"], kwargs)


Factory = Callable[[], torch.nn.Module]
