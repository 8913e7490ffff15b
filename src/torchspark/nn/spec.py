"""Module specs: how a network's architecture is written to JSON, so it can be rebuilt without pickle.

A spec is ``{"factory": "package.module:function", "kwargs": {...}}``. Zoo models attach their spec to the
module they return; [`from_factory`][torchspark.from_factory] does the same for any importable factory of yours. Rebuilding a module
from a spec read from a file goes through a code policy: `torchspark.nn.trust.build_from_spec`.

Any other module (your own ``nn.Module`` subclass) is saved by its class: `class_spec` records
``"factory": "pkg.mod:MyNet"`` (the class is its own factory), the constructor arguments when they were recorded
(a class decorated with [`capture`][torchspark.nn.capture] records its JSON-able ones at construction), and under
``"rebuild"`` whether a load can build it from the file alone:

- ``"captured"``: built again as ``MyNet(**kwargs)`` with the recorded arguments;
- ``"defaults"``: the arguments were not recorded but ``MyNet()`` needs none: built with its defaults (right
  only when it was built with them; a different size is refused by the weights' shape check);
- ``"none"``: its constructor needs arguments that were not recorded (``"reason"`` says which): loading needs
  ``module=MyNet(...)``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from torchspark.errors import ConfigError

__all__ = [
    "from_factory",
    "module_spec",
    "attach_spec",
    "import_object",
    "capture",
    "class_spec",
    "class_path",
    "SPEC_ATTR",
    "CAPTURE_ATTR",
]

M = TypeVar("M", bound=torch.nn.Module)

SPEC_ATTR = "_torchspark_spec"
#: where [`capture`][torchspark.nn.capture] keeps a module's recorded constructor call
CAPTURE_ATTR = "_torchspark_init"


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


def class_path(cls: type) -> str:
    """``"package.module:QualName"`` of a class: what a saved module names and ``factories=[cls]`` allows."""
    return f"{cls.__module__}:{cls.__qualname__}"


def _json_problem(name: str, value: Any) -> str | None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return f"argument {name!r} ({type(value).__name__}) has no JSON form"
    return None


def _recorded_call(cls: type, signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict:
    """The constructor call ``cls(*args, **kwargs)`` as ``{"kwargs": ...}``, or ``{"problem": why not}``."""
    try:
        bound = signature.bind(None, *args, **kwargs)  # None stands for self
    except TypeError as e:  # the constructor itself would have refused the call
        return {"problem": f"its arguments could not be bound to {cls.__qualname__}.__init__: {e}"}
    recorded: dict[str, Any] = {}
    params = list(signature.parameters.values())[1:]
    for p in params:
        if p.name not in bound.arguments:
            continue
        value = bound.arguments[p.name]
        if p.kind is inspect.Parameter.POSITIONAL_ONLY or (p.kind is inspect.Parameter.VAR_POSITIONAL and value):
            return {"problem": f"argument {p.name!r} is positional-only; only keyword-able arguments are recorded"}
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            items = dict(value)
        elif p.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        else:
            items = {p.name: value}
        for name, v in items.items():
            problem = _json_problem(name, v)
            if problem:
                return {"problem": problem}
            recorded[name] = v
    return {"kwargs": json.loads(json.dumps(recorded))}


def capture(cls: type[M]) -> type[M]:
    """Class decorator: record the constructor arguments of every instance, so a saved network rebuilds it.

    ``Network(MyNet(4, hidden=16)).save(path)`` then writes ``{"factory": "pkg.mod:MyNet", "kwargs": {"n_in": 4,
    "hidden": 16}}`` and [`Network.load`][torchspark.Network.load] builds ``MyNet(n_in=4, hidden=16)`` again (when
    the class is allowed: ``factories=[MyNet]`` or ``trust_code=True``). Only JSON-able arguments (numbers,
    strings, booleans, None, lists, dicts; tuples become lists) are recorded; a module built with another one (a
    layer, a function) saves without arguments and loads with ``module=MyNet(...)``. A subclass records its own
    call only when it is decorated too. Nothing is pickled.

    Example::

        @torchspark.nn.capture
        class MyNet(torch.nn.Module):
            def __init__(self, n_in: int, hidden: int = 32) -> None: ...

    Raises:
        ConfigError: ``cls`` is not a ``torch.nn.Module`` subclass.
    """
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ConfigError(f"capture decorates torch.nn.Module subclasses, got {cls!r}")
    init = cls.__init__
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if type(self) is cls:  # a subclass's call is its own (recorded only if it is decorated too)
            call = _recorded_call(cls, signature, args, kwargs)
            object.__setattr__(self, CAPTURE_ATTR, {"class": class_path(cls), **call})

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def _required_arguments(cls: type) -> list[str] | None:
    """The names ``cls.__init__`` requires (None: its signature cannot be read, or it takes ``*args`` or
    ``**kwargs``, as ``nn.Sequential`` does: what it was built from is unknown)."""
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # type: ignore[misc]
    except (TypeError, ValueError):
        return None
    if any(p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) for p in params):
        return None
    return [p.name for p in params if p.default is inspect.Parameter.empty]


def class_spec(module: torch.nn.Module) -> dict[str, Any]:
    """The JSON spec a saved network records for a module without a factory spec: its class's import path, the
    arguments [`capture`][torchspark.nn.capture] recorded, and whether a load can rebuild it (``"rebuild"``, see
    the module docstring).

    Example: ``class_spec(MyNet(4))["rebuild"]`` is ``"none"`` when ``MyNet.__init__`` requires ``n_in`` and the
    class is not decorated with ``capture``.
    """
    cls = type(module)
    path = class_path(cls)
    spec: dict[str, Any] = {"factory": path, "kwargs": {}, "class": path}
    recorded = getattr(module, CAPTURE_ATTR, None)
    if isinstance(recorded, dict) and recorded.get("class") == path:
        if "kwargs" in recorded:
            return {**spec, "kwargs": recorded["kwargs"], "rebuild": "captured"}
        why = f"its constructor arguments were not recorded: {recorded.get('problem')}"
    else:
        required = _required_arguments(cls)
        if required == []:
            return {**spec, "rebuild": "defaults"}
        needs = f"requires {', '.join(required)}" if required else "takes arguments (*args/**kwargs: its layers)"
        why = (
            f"{cls.__qualname__}.__init__ {needs}, which were not recorded (decorate the class with "
            "@torchspark.nn.capture, or build it with torchspark.nn.from_factory, to record them)"
        )
    return {**spec, "rebuild": "none", "reason": why}


Factory = Callable[[], torch.nn.Module]
