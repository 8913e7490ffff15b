"""Module specs: how a network's architecture is written to JSON, so it can be rebuilt without pickle.

A spec is ``{"factory": "package.module:function", "kwargs": {...}}``. Zoo models attach their spec to the
module they return; [`from_factory`][torchspark.from_factory] does the same for any importable factory of yours. Rebuilding a module
from a spec read from a file goes through a code policy: `torchspark.nn.trust.build_from_spec`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

import torch

from torchspark.errors import ConfigError

__all__ = ["from_factory", "module_spec", "attach_spec", "import_object", "SPEC_ATTR"]

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
    """Record how ``module`` was built so [`Network.save`][torchspark.Network.save] can write it as JSON."""
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
    """The JSON spec of a module built by the zoo or [`from_factory`][torchspark.from_factory], else None."""
    spec = getattr(module, SPEC_ATTR, None)
    return dict(spec) if isinstance(spec, dict) else None


Factory = Callable[[], torch.nn.Module]
