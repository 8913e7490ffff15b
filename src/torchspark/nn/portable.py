"""A network as portable parts (JSON config, weights, updater and extra state), on disk and in memory.

On disk a network is a directory:

- ``config.json``: architecture spec, loss, updater, knobs and counters (JSON, no code);
- ``weights.safetensors``: the module's ``state_dict`` (parameters and buffers);
- ``updater.safetensors``: the flat optimizer state and, for ``precision="fp16"``, the gradient scaler's state
  (when saved);
- ``extra.safetensors``: training-master state such as gradient-sharing residuals (when present);
- ``objects.pkl``: only with ``allow_pickle=True``, the parts that have no JSON form.

``config.json`` records the SHA-256 of every other file (``"checksums"``), verified when the network is loaded: a
flipped bit in the weights is refused with a [`SerializationError`][torchspark.errors.SerializationError] naming the file, never
loaded as a silently different network (and ``objects.pkl`` is checked before it is unpickled). A model saved
before checksums were recorded loads with a warning that it was not verified. Before the network is built, the
size of the network ``config.json`` describes is checked against the weights file (the module is sized on PyTorch's
``meta`` device, which allocates nothing): a config asking for a network far larger than its weights is refused
rather than allocated.

In memory the same parts travel as a `Blueprint`. Both build networks of a class they are handed
(`build_network`, `torchspark.nn.parts`), so [`Network`][torchspark.Network] saves, loads and copies itself through it without this
module importing it; `torchspark.nn.serialization` holds the entry points for ``Network``
([`load_network`][torchspark.nn.load_network], [`NetworkBlueprint`][torchspark.nn.NetworkBlueprint]).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import posixpath
import struct
from dataclasses import dataclass, field
from typing import Any, TypeVar

import cloudpickle
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from torchspark._atomic_dir import write_directory
from torchspark._bounded import load_json
from torchspark._io import filesystem, join, read_bytes, read_safetensors_metadata
from torchspark.errors import SerializationError
from torchspark.nn.parts import (
    FORMAT,
    VERSION,
    N,
    NetworkClass,
    PortableNetwork,
    build_network,
    load_weights,
    portable_parts,
    rebuild,
    weights_of,
)
from torchspark.nn.spec import class_spec
from torchspark.nn.trust import CodePolicy, Factories, build_from_spec, code_policy

# the parts (`torchspark.nn.parts`) are re-exported: this module is where saving and rebuilding are imported from
__all__ = [
    "PortableNetwork",
    "Blueprint",
    "FORMAT",
    "VERSION",
    "MODEL_FILES",
    "portable_parts",
    "weights_of",
    "build_network",
    "save_network",
    "read_network",
    "check_save_target",
    "checksum",
]

log = logging.getLogger(__name__)

#: every file a saved network directory may hold; saving replaces a directory only when it holds nothing else
MODEL_FILES = frozenset(
    {"config.json", "weights.safetensors", "updater.safetensors", "extra.safetensors", "objects.pkl"}
)


def checksum(blob: bytes) -> str:
    """The content hash a saved network records for one of its files: ``"sha256:<hex>"``.

    SHA-256 rather than BLAKE2b: OpenSSL runs it on the CPU's SHA extensions, about twice BLAKE2b's speed where
    they exist (BENCHMARKS.md, "Measurements behind design choices")."""
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _checksums(config: dict[str, Any], path: str) -> dict[str, str] | None:
    """The ``"checksums"`` ``config.json`` records (None: a model saved before they were, loaded with a warning)."""
    found = config.get("checksums")
    if found is None:
        log.warning(
            "%r was saved without checksums (by an older torchspark): its files are loaded unverified; save it "
            "again to record them",
            path,
        )
        return None
    if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
        raise SerializationError(
            f"{join(path, 'config.json')!r} has checksums that are not a mapping of file names to hashes: the file "
            "is damaged; load an earlier save or save the network again"
        )
    return found


def _read_checked(path: str, name: str, checksums: dict[str, str] | None) -> bytes:
    """File ``name`` of the saved network at ``path``, verified against its recorded checksum."""
    url = join(path, name)
    blob = read_bytes(url, SerializationError)
    if checksums is None:
        return blob
    expected = checksums.get(name)
    if expected is None:
        raise SerializationError(
            f"{join(path, 'config.json')!r} records no checksum for {name!r}: the config is damaged or was edited; "
            "load an earlier save or save the network again"
        )
    actual = checksum(blob)
    if actual != expected:
        raise SerializationError(
            f"{url!r} does not match the checksum recorded when it was saved ({expected[:23]}..., the file now "
            f"hashes to {actual[:23]}...): the file is damaged; load an earlier save or retrain"
        )
    return blob


def _tensor_bytes(blob: bytes) -> int | None:
    """The bytes of tensor data a safetensors blob holds after its header (None: too damaged to tell)."""
    if len(blob) < 8:
        return None
    (n,) = struct.unpack("<Q", blob[:8])
    return len(blob) - 8 - n if n <= len(blob) - 8 else None


def _check_size(config: dict[str, Any], policy: CodePolicy, weights: bytes, path: str) -> None:
    """Refuse a ``config.json`` describing a network much larger than its weights file, before anything is built.

    The module is built on PyTorch's ``meta`` device (shapes only, no memory); a factory that cannot build there is
    not sized (loading the weights into it still checks every shape)."""
    have = _tensor_bytes(weights)
    spec = config.get("module")
    if have is None or not isinstance(spec, dict):
        return
    try:
        with torch.device("meta"):
            module = build_from_spec(spec, policy, repr(join(path, "config.json")))
        needed = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    except Exception as e:  # any factory error surfaces when the network is built for real
        log.debug("could not size %r on the meta device: %s", path, e)
        return
    if needed > have + max(have, 1 << 20):
        raise SerializationError(
            f"{join(path, 'config.json')!r} describes a network whose weights take {needed:,} bytes, but "
            f"{join(path, 'weights.safetensors')!r} holds {have:,} bytes of tensors: the config is damaged or "
            "belongs to another model (refused before allocating it); load an earlier save or the matching config"
        )


def _check_finite(weights: dict[str, torch.Tensor], url: str) -> None:
    """A saved network with NaN/inf weights is refused at load (it would only fail later, as a diverged fit)."""
    bad = [name for name, w in weights.items() if w.is_floating_point() and not bool(torch.isfinite(w).all())]
    if bad:
        raise SerializationError(
            f"{url!r} holds non-finite (NaN/inf) weights in {', '.join(bad[:5])}"
            f"{' ...' if len(bad) > 5 else ''}: the model was saved after it diverged or the "
            "file is damaged; load an earlier save or retrain"
        )


def _check_replaceable(names: list[str]) -> str | None:
    """Why an existing directory must not be replaced by a saved model (None: it is empty or a model)."""
    foreign = sorted(n for n in names if n not in MODEL_FILES and not n.startswith("."))
    if foreign:
        return (
            f"holds files that are not part of a saved network ({foreign[:5]}); saving replaces the whole "
            "directory. Save to a new or empty directory, or move those files away"
        )
    if names and "config.json" not in names:
        return "is not empty and holds no saved network; save to a new or empty directory"
    return None


def check_save_target(path: str, error: type[Exception] = SerializationError) -> None:
    """Raise ``error`` now if [`save_network`][torchspark.nn.save_network] would refuse ``path`` (a file, or a directory holding other
    things than a saved network), so a long run can check its destination before it starts.

    Example: ``check_save_target("out/model", ConfigError)`` before a fit that saves there."""
    fs, root = filesystem(path)
    if not fs.exists(root):
        return
    if not fs.isdir(root):
        raise error(f"{path!r} exists and is not a directory; save to a directory path")
    reason = _check_replaceable([posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)])
    if reason:
        raise error(f"{path!r} {reason}")


def save_network(net: PortableNetwork, path: str, save_updater: bool = True, allow_pickle: bool = False) -> str:
    """Write ``net`` to the directory ``path`` (see the module docstring). Returns ``path``.

    The whole directory is written under a temporary name and then swapped in (see
    `torchspark._atomic_dir.write_directory`): a failed save (a full disk) leaves any model already at
    ``path`` unchanged, never new weights under an old config. An existing ``path`` is replaced only when it holds
    a saved network or nothing.

    Example: ``save_network(net, "s3://bucket/models/m1")``.
    """
    config, objects = portable_parts(net)
    if "module" in objects and not allow_pickle:
        # your own module: its class's import path (and captured arguments), never the pickled module
        config["module"] = class_spec(objects.pop("module"))
    if objects and not allow_pickle:
        raise SerializationError(
            f"cannot save {sorted(objects)} of this network as JSON: use a named loss ('cross_entropy', 'mse', "
            "'bce_with_logits') or an import path 'pkg.mod:fn' for the loss, a torchspark.optim spec (such as "
            "Adam(lr=1e-3)) for the updater, or pass allow_pickle=True (then only trusted code should load it)"
        )
    files: dict[str, bytes] = {"weights.safetensors": st_save(weights_of(net), {"format": FORMAT})}
    if save_updater:
        files["updater.safetensors"] = st_save(
            {"updater_state": net.updater_state().cpu().contiguous(), **net.amp.state_tensors()}
        )
    if net.extra_state:
        files["extra.safetensors"] = st_save({k: v.detach().cpu().contiguous() for k, v in net.extra_state.items()})
    if objects:
        files["objects.pkl"] = cloudpickle.dumps(objects)
        config["pickled"] = sorted(objects)
    config["files"] = list(files)
    config["checksums"] = {name: checksum(blob) for name, blob in files.items()}
    files["config.json"] = json.dumps(config, indent=2).encode()
    return write_directory(path, files, SerializationError, _check_replaceable)


def _load_tensors(url: str, raw: bytes) -> dict[str, torch.Tensor]:
    try:
        return st_load(raw)
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise SerializationError(f"{url!r} is not a valid safetensors file: {e}") from e


def _read_config(path: str) -> dict[str, Any]:
    url = join(path, "config.json")
    raw = read_bytes(url, SerializationError)
    config = load_json(raw, f"{url!r} (damaged, or not a torchspark model's config)", SerializationError)
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise SerializationError(f"{path!r} does not hold a torchspark network (config.json has no format marker)")
    version = config.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise SerializationError(f"{url!r} has version {version!r}, expected an integer; the file is damaged")
    if version > VERSION:
        raise SerializationError(
            f"{path!r} was saved by a newer torchspark (format version {version}); upgrade torchspark"
        )
    return config


def read_network(
    network_class: NetworkClass[N],
    path: str,
    allow_pickle: bool = False,
    factories: Factories = None,
    trust_code: bool = False,
    module: torch.nn.Module | None = None,
) -> N:
    """A ``network_class`` instance from a directory written by [`save_network`][torchspark.nn.save_network]; the arguments and errors are
    [`torchspark.nn.load_network`][torchspark.nn.load_network]'s.

    Example: ``read_network(Network, "models/m1", factories=[build])``.
    """
    if module is not None and not isinstance(module, torch.nn.Module):
        raise SerializationError(
            f"module= must be a torch.nn.Module built as the saved one was (module=MyNet(...)), got {module!r}"
        )
    policy = code_policy(factories, trust_code=bool(trust_code) or allow_pickle is True)
    fs, root = filesystem(path)
    if not fs.exists(root):
        raise SerializationError(f"no saved network at {path!r} (the directory does not exist)")
    config = _read_config(path)
    checksums = _checksums(config, path)
    objects: dict[str, Any] = {}
    pickled = config.get("pickled")
    if pickled and not (module is not None and pickled == ["module"]):  # module= replaces a pickled module
        if not allow_pickle:
            raise SerializationError(
                f"{path!r} stores {config['pickled']} as pickle, which can run arbitrary code; "
                "pass allow_pickle=True only if you trust this file"
            )
        objects = cloudpickle.loads(_read_checked(path, "objects.pkl", checksums))  # verified before unpickling
    files = config.get("files", [])
    weights_blob = _read_checked(path, "weights.safetensors", checksums)
    if module is None:
        _check_size(config, policy, weights_blob, path)
    else:
        objects["module"] = module  # the caller's module: nothing the file names is built
    net = rebuild(network_class, config, objects, None, policy, repr(join(path, "config.json")))
    weights = _load_tensors(join(path, "weights.safetensors"), weights_blob)
    del weights_blob
    _check_finite(weights, join(path, "weights.safetensors"))
    load_weights(net, weights, path, _mismatch_hint(config, module))
    if "updater.safetensors" in files:
        updater = _load_tensors(
            join(path, "updater.safetensors"), _read_checked(path, "updater.safetensors", checksums)
        )
        net.set_updater_state(updater["updater_state"])
        net.amp.load_state_tensors(updater)
    if "extra.safetensors" in files:
        extra = _read_checked(path, "extra.safetensors", checksums)
        net.extra_state = dict(_load_tensors(join(path, "extra.safetensors"), extra))
    return net


def _mismatch_hint(config: dict[str, Any], module: torch.nn.Module | None) -> str:
    """What to do when the saved weights do not fit the module they are loaded into."""
    found = config.get("module")
    spec: dict[str, Any] = found if isinstance(found, dict) else {}
    saved = spec.get("class") or spec.get("factory") or "the saved module"
    if module is not None:
        return f"module= must be the architecture the file was saved from ({saved}), built with the same arguments"
    if spec.get("rebuild") == "defaults":
        return (
            f"{saved} was rebuilt with its constructor's defaults (its arguments were not recorded): pass "
            "module=... built as it was saved, or decorate the class with @torchspark.nn.capture before saving"
        )
    return "The file is damaged or its config belongs to another model; load an earlier save"


B = TypeVar("B", bound="Blueprint")


@dataclass
class Blueprint:
    """Everything needed to rebuild a network elsewhere: JSON config, weights, updater and extra state.

    Parts without a JSON form (a plain module instance, a lambda loss) travel cloudpickled *in memory* (as
    Spark itself ships closures); nothing pickled is written to disk. [`NetworkBlueprint`][torchspark.nn.NetworkBlueprint]
    is this for [`Network`][torchspark.Network] (its ``build()`` needs no class).

    Example: ``Blueprint.of(net).build_as(Network)`` is a deep copy of ``net`` on the CPU.
    """

    config: dict[str, Any]
    weights: dict[str, torch.Tensor]
    updater_state: torch.Tensor
    extra_state: dict[str, torch.Tensor] = field(default_factory=dict)
    pickled: bytes | None = None
    #: fp16's gradient-scaler state (empty for fp32 and bf16)
    scaler_state: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls: type[B], net: PortableNetwork) -> B:
        """The blueprint of ``net`` (CPU copies of its tensors)."""
        config, objects = portable_parts(net)
        return cls(
            config=config,
            weights=weights_of(net),
            updater_state=net.updater_state().cpu(),
            extra_state={k: v.detach().cpu().clone() for k, v in net.extra_state.items()},
            pickled=cloudpickle.dumps(objects) if objects else None,
            scaler_state=net.amp.state_tensors(),
        )

    def build_as(self, network_class: NetworkClass[N], device: str | torch.device | None = None) -> N:
        """A fresh ``network_class`` instance with these weights and state (on ``device``)."""
        objects = cloudpickle.loads(self.pickled) if self.pickled else {}
        # trusted: the blueprint is the driver's own network in memory (its factories are code the driver already
        # ran, shipped as Spark ships closures), never a file
        return build_network(
            network_class,
            self.config,
            objects,
            self.weights,
            self.updater_state,
            self.extra_state,
            device,
            policy=CodePolicy(trust_code=True),
            source="the blueprint",
            scaler_state=self.scaler_state,
        )

    def to_bytes(self) -> bytes:
        """One safetensors blob (config and any in-memory pickle ride in its metadata)."""
        tensors = {f"w.{k}": v.contiguous() for k, v in self.weights.items()}
        tensors["updater_state"] = self.updater_state.contiguous()
        tensors.update({f"x.{k}": v.contiguous() for k, v in self.extra_state.items()})
        tensors.update({f"s.{k}": v.contiguous() for k, v in self.scaler_state.items()})
        meta = {"config": json.dumps(self.config)}
        if self.pickled:
            meta["pickled"] = base64.b64encode(self.pickled).decode()
        return st_save(tensors, meta)

    @classmethod
    def from_bytes(cls: type[B], blob: bytes) -> B:
        """The blueprint [`to_bytes`][torchspark.nn.portable.Blueprint.to_bytes] wrote."""
        tensors = st_load(blob)
        meta = read_safetensors_metadata(blob)
        return cls(
            config=load_json(meta["config"], "the blueprint's config", SerializationError),
            weights={k[2:]: v for k, v in tensors.items() if k.startswith("w.")},
            updater_state=tensors["updater_state"],
            extra_state={k[2:]: v for k, v in tensors.items() if k.startswith("x.")},
            pickled=base64.b64decode(meta["pickled"]) if "pickled" in meta else None,
            scaler_state={k[2:]: v for k, v in tensors.items() if k.startswith("s.")},
        )
