"""A network as portable parts: its JSON config, the objects only pickle can hold, its weights; and a network
built back from them.

`portable_parts` splits a network's description into JSON (architecture spec, loss, updater, knobs and
counters) and the objects without a JSON form; `build_network` makes a network of the class it is handed
from those parts, weights and state. Both the saved directory (`torchspark.nn.portable`) and the in-memory
`Blueprint` go through these two, so a saved network and a shipped one are built
the same way, by names the `torchspark.nn.trust` policy allows.

Example: ``build_network(Network, *portable_parts(net), weights_of(net), net.updater_state(), {})`` is a copy
of a network whose parts are all JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

from torchspark.errors import ConfigError, SerializationError
from torchspark.nn.losses import LOSSES, Loss, resolve_loss
from torchspark.nn.lr_scheduler import LrSchedulerLike, LrScheduling, lr_scheduler_from_json, lr_scheduler_to_json
from torchspark.nn.precision import Precision
from torchspark.nn.spec import module_spec
from torchspark.nn.trust import CodePolicy, build_from_spec
from torchspark.optim import UpdaterLike, updater_from_dict, updater_to_json

__all__ = [
    "FORMAT",
    "VERSION",
    "PortableNetwork",
    "NetworkClass",
    "portable_parts",
    "weights_of",
    "rebuild",
    "load_weights",
    "weight_mismatches",
    "build_network",
]

FORMAT = "torchspark.network"
VERSION = 1


class PortableNetwork(Protocol):
    """What saving and rebuilding read and write of a network ([`Network`][torchspark.Network] provides it)."""

    module: torch.nn.Module
    losses: list[Loss]
    device: torch.device
    seed: int | None
    weight_decay: float
    l1: float
    gradient_clip: float | None
    memory_format: str
    precision: str
    amp: Precision
    compile: bool | str
    iteration: int
    epoch: int
    extra_config: dict[str, Any]
    extra_state: dict[str, torch.Tensor]
    lr_scheduler: LrSchedulerLike | None
    lr_scheduler_interval: str | None
    lr_scheduling: LrScheduling | None

    @property
    def updater(self) -> UpdaterLike:  # read-only here: Network holds a resolved spec, a narrower type
        ...

    def num_params(self) -> int: ...

    def updater_state(self) -> torch.Tensor: ...

    def set_updater_state(self, flat: torch.Tensor) -> None: ...


N = TypeVar("N", bound=PortableNetwork)
#: the class a network is rebuilt as, called as ``Network(module, loss=..., updater=..., ...)``
NetworkClass = Callable[..., N]


def portable_parts(net: PortableNetwork) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the network's description into JSON parts and the objects only pickle can store."""
    config: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "seed": net.seed,
        "weight_decay": net.weight_decay,
        "l1": net.l1,
        "gradient_clip": net.gradient_clip,
        "memory_format": net.memory_format,
        "precision": net.precision,
        "compile": net.compile,
        "iteration": net.iteration,
        "epoch": net.epoch,
        "num_params": net.num_params(),
        "extra_config": net.extra_config,
    }
    objects: dict[str, Any] = {}
    spec = module_spec(net.module)
    if spec is not None:
        config["module"] = spec
    else:
        objects["module"] = net.module
    loss_names = [lo.to_json_value() for lo in net.losses]
    if all(n is not None for n in loss_names):
        config["loss"] = loss_names
    else:
        objects["loss"] = net.losses
    updater = updater_to_json(net.updater)
    if updater is not None:
        config["updater"] = updater
    else:
        objects["updater"] = net.updater
    if net.lr_scheduler is not None:  # a schedule or torch scheduler factory, its interval and its position
        scheduler = lr_scheduler_to_json(net.lr_scheduler)
        if scheduler is not None:
            config["lr_scheduler"] = scheduler
        else:
            objects["lr_scheduler"] = net.lr_scheduler
        config["lr_scheduler_interval"] = net.lr_scheduler_interval
        scheduling = net.lr_scheduling
        config["lr_scheduler_state"] = None if scheduling is None else scheduling.state(net.iteration, net.epoch)
    return config, objects


def weights_of(net: PortableNetwork) -> dict[str, torch.Tensor]:
    """The module's ``state_dict`` as contiguous CPU copies."""
    # clone: parameters are views of one flat buffer, which safetensors refuses as shared storage
    return {k: v.detach().cpu().clone().contiguous() for k, v in net.module.state_dict().items()}


def _losses(value: Any, policy: CodePolicy, source: str) -> list[Loss]:
    names = value if isinstance(value, list) else [value]
    if not names:
        raise SerializationError(f"{source} names no loss")
    losses = []
    for name in names:
        if not isinstance(name, str) or (name not in LOSSES and ":" not in name):
            raise SerializationError(
                f"{source} names the unknown loss {name!r}; saved losses are one of "
                f"{sorted(LOSSES)} or an import path 'pkg.mod:fn'"
            )
        losses.append(resolve_loss(name, importer=lambda path: policy.resolve(path, "loss function", source)))
    return losses


def rebuild(
    network_class: NetworkClass[N],
    config: dict[str, Any],
    objects: dict[str, Any],
    device: str | torch.device | None,
    policy: CodePolicy,
    source: str,
) -> N:
    """A network from its JSON config (names resolved through ``policy``: see `torchspark.nn.trust`)."""
    try:
        module = objects["module"] if "module" in objects else build_from_spec(config["module"], policy, source)
        loss = objects["loss"] if "loss" in objects else _losses(config["loss"], policy, source)
        updater = objects["updater"] if "updater" in objects else updater_from_dict(config["updater"])
        scheduler = objects.get("lr_scheduler")
        if scheduler is None and config.get("lr_scheduler") is not None:
            scheduler = lr_scheduler_from_json(config["lr_scheduler"], source)
        net = network_class(
            module,
            loss=loss if len(loss) > 1 else loss[0],
            updater=updater,
            seed=None,
            weight_decay=config["weight_decay"],
            gradient_clip=config["gradient_clip"],
            device=device,
            memory_format=config.get("memory_format", "contiguous"),
            l1=float(config.get("l1", 0.0)),
            precision=config.get("precision", "fp32"),
            compile=config.get("compile", False),
            lr_scheduler=scheduler,
            lr_scheduler_interval=config.get("lr_scheduler_interval"),
        )
        net.seed = config.get("seed")
        net.iteration = int(config.get("iteration", 0))
        net.epoch = int(config.get("epoch", 0))
        if net.lr_scheduling is not None:
            net.lr_scheduling.restore(config.get("lr_scheduler_state"))
        net.extra_config = dict(config.get("extra_config") or {})
    except SerializationError:
        raise
    except KeyError as e:
        raise SerializationError(
            f"{source} has no {e.args[0]!r} entry; the file is damaged or not a torchspark model"
        ) from e
    except (ConfigError, TypeError, ValueError, AttributeError) as e:
        raise SerializationError(f"{source} describes a network that cannot be built: {e}") from e
    return net


#: how many tensors a mismatch message lists by name before it counts the rest
LISTED_TENSORS = 100


def weight_mismatches(expected: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> list[str]:
    """Each tensor where ``weights`` (a saved ``state_dict``) does not fit ``expected`` (a module's): missing,
    unexpected, or of another shape, named with its shapes. Empty when they fit."""

    def shape(t: torch.Tensor) -> list[int]:
        return list(t.shape)

    found = [
        f"{k}: saved {shape(weights[k])}, the module has {shape(v)}"
        for k, v in expected.items()
        if k in weights and weights[k].shape != v.shape
    ]
    found += [
        f"{k}: missing from the file (the module has {shape(v)})" for k, v in expected.items() if k not in weights
    ]
    found += [f"{k}: saved {shape(v)}, not in the module" for k, v in weights.items() if k not in expected]
    return found


def load_weights(net: PortableNetwork, weights: dict[str, torch.Tensor], source: str, hint: str = "") -> None:
    """Load ``weights`` (a ``state_dict``) into the network's module, every name and shape checked first.

    Args:
        hint: what to do about a mismatch, appended to the message (default: load with the module it was saved
            from).
    Raises:
        SerializationError: they do not fit its architecture: the message names ``source`` and each missing,
            unexpected and differently shaped tensor with its shapes.
    """
    problems = weight_mismatches(net.module.state_dict(), weights)
    if problems:
        listed = "; ".join(problems[:LISTED_TENSORS])
        more = f"; and {len(problems) - LISTED_TENSORS} more" if len(problems) > LISTED_TENSORS else ""
        raise SerializationError(
            f"weights in {source} do not fit the {type(net.module).__name__} module ({len(problems)} "
            f"tensor(s)): {listed}{more}. "
            + (hint or "Load them into the architecture they were saved from (module=... built as it was saved)")
        )
    try:
        net.module.load_state_dict(weights)
    except RuntimeError as e:
        raise SerializationError(f"weights in {source} do not fit the network architecture: {e}") from e


def build_network(
    network_class: NetworkClass[N],
    config: dict[str, Any],
    objects: dict[str, Any],
    weights: dict[str, torch.Tensor],
    updater_state: torch.Tensor | None,
    extra_state: dict[str, torch.Tensor],
    device: str | torch.device | None = None,
    policy: CodePolicy | None = None,
    source: str = "the network config",
    scaler_state: dict[str, torch.Tensor] | None = None,
) -> N:
    """A ``network_class`` instance from portable parts, with these weights, updater and extra state.

    Args:
        network_class: the class to build ([`Network`][torchspark.Network]).
        config, objects: `portable_parts` output (``objects`` unpickled).
        weights: a ``state_dict`` (`weights_of`).
        updater_state: the flat optimizer state, or None to keep the fresh (zero) state.
        extra_state: training-master tensors, copied onto the network's device.
        device: where the network lives (None: CPU).
        policy: which functions ``config`` may name (default: only torchspark's zoo and losses).
        source: where the parts came from, in messages.
        scaler_state: fp16's gradient-scaler state ([`state_tensors`][torchspark.nn.Precision.state_tensors]), or
            None to keep the fresh one.
    Raises:
        SerializationError: a damaged config, a name the policy does not allow, or weights that do not fit.

    Example: ``build_network(Network, *portable_parts(net), weights_of(net), net.updater_state(), {})`` is a copy
    of a network whose parts are all JSON.
    """
    net = rebuild(network_class, config, objects, device, policy or CodePolicy(), source)
    load_weights(net, weights, source)
    if updater_state is not None:
        net.set_updater_state(updater_state)
    net.amp.load_state_tensors(scaler_state or {})
    net.extra_state = {k: v.to(net.device, copy=True) for k, v in extra_state.items()}
    return net
