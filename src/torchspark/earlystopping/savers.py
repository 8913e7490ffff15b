"""Where early stopping keeps the best (and latest) model: in memory or in a directory.

DL4J's ``InMemoryModelSaver`` and ``LocalFileModelSaver``. The directory saver writes the network in torchspark's
format (``config.json`` + safetensors, no pickle) and switches models atomically: each save goes to a new
subdirectory, then a small JSON pointer (``best_model.json`` / ``latest_model.json``) is renamed into place, then
the previous subdirectory is removed. A reader, or a run that crashes mid-save, sees either the old complete model
or the new one, never a mix.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import uuid
from typing import Any, Protocol

import torch

from torchspark._bounded import load_json
from torchspark._io import atomic_write_bytes, filesystem, join, make_dirs, read_bytes
from torchspark.errors import ConfigError, SerializationError
from torchspark.nn import Network, module_spec
from torchspark.optim import UpdaterSpec

__all__ = ["ModelSaver", "InMemoryModelSaver", "DirectoryModelSaver", "check_saveable"]

log = logging.getLogger(__name__)


class ModelSaver(Protocol):
    """Keeps the best and the latest model of an early-stopping run."""

    def save_best(self, network: Network, epoch: int, score: float) -> None: ...

    def save_latest(self, network: Network, epoch: int, score: float) -> None: ...

    def best(self) -> Network | None: ...

    def latest(self) -> Network | None: ...


class InMemoryModelSaver:
    """Copies of the networks in driver memory (the default). Costs one copy of the weights and updater state
    per kept model; use [`DirectoryModelSaver`][torchspark.earlystopping.DirectoryModelSaver] for large models or to keep the best model after a crash."""

    def __init__(self) -> None:
        self._best: Network | None = None
        self._latest: Network | None = None

    def save_best(self, network: Network, epoch: int, score: float) -> None:
        self._best = network.copy()

    def save_latest(self, network: Network, epoch: int, score: float) -> None:
        self._latest = network.copy()

    def best(self) -> Network | None:
        return self._best

    def latest(self) -> Network | None:
        return self._latest


def check_saveable(network: Network) -> None:
    """Refuse, before training, a network that cannot be written without pickle (a callable loss or updater).
    Every module can: your own is saved by its class (see [`Network.save`][torchspark.Network.save])."""
    problems = []
    if any(loss.to_json_value() is None for loss in network.losses):
        problems.append("its loss is a callable (use a named loss or an import path 'pkg.mod:fn')")
    if not isinstance(network.updater, UpdaterSpec):
        problems.append("its updater is a callable (use a torchspark.optim spec such as Adam(lr=1e-3))")
    if problems:
        raise ConfigError(
            "DirectoryModelSaver cannot save this network: " + "; ".join(problems) + ". Or use InMemoryModelSaver."
        )


class DirectoryModelSaver:
    """Best and latest models as torchspark network directories under ``directory`` (any fsspec URL).

    Layout: ``best_model.json`` ``{"path": ..., "epoch": ..., "score": ...}`` points to the current best model's
    subdirectory (``best_model-<id>/``, loadable with ``Network.load``); the same for ``latest_model``.
    [`load_best`][torchspark.earlystopping.DirectoryModelSaver.load_best] reads a finished run's best model back.

    A network of your own module reads back in the process that saved it into a copy of that module (the
    architecture it trained; no code is imported); [`load_best`][torchspark.earlystopping.DirectoryModelSaver.load_best]
    in another process takes ``module=``, ``factories`` or ``trust_code`` as
    [`Network.load`][torchspark.Network.load] does.

    Args:
        directory: where to write; created when missing. Point it at durable storage to keep the best model
            if the driver dies.
        save_updater: also store the updater state (momentum, Adam moments): needed to continue training from the
            saved model, twice the bytes (Adam: three times) otherwise unneeded.
    """

    def __init__(self, directory: str, save_updater: bool = True) -> None:
        if not isinstance(directory, str) or not directory:
            raise ConfigError(f"DirectoryModelSaver: directory must be a non-empty path or URL, got {directory!r}")
        if not isinstance(save_updater, bool):
            raise ConfigError(f"DirectoryModelSaver: save_updater must be True or False, got {save_updater!r}")
        self.directory = directory
        self.save_updater = save_updater
        #: the module of the last network saved, when it is the user's own (a copy of it is what a read builds)
        self._template: torch.nn.Module | None = None

    def check(self, network: Network) -> None:
        """Fail before training when ``network`` cannot be saved here."""
        check_saveable(network)
        make_dirs(self.directory, ConfigError, "early-stopping model directory")

    def save_best(self, network: Network, epoch: int, score: float) -> None:
        self._save("best_model", network, epoch, score)

    def save_latest(self, network: Network, epoch: int, score: float) -> None:
        self._save("latest_model", network, epoch, score)

    def best(self) -> Network | None:
        return self._load("best_model")

    def latest(self) -> Network | None:
        return self._load("latest_model")

    @classmethod
    def load_best(
        cls,
        directory: str,
        module: torch.nn.Module | None = None,
        factories: Any = None,
        trust_code: bool = False,
    ) -> Network:
        """The best model a run saved in ``directory``; ``module``, ``factories`` and ``trust_code`` as for
        [`Network.load`][torchspark.Network.load] (a module of your own: ``module=MyNet(...)``)."""
        net = cls(directory)._load("best_model", module, factories, trust_code)
        if net is None:
            raise SerializationError(f"no best model saved in {directory!r} (best_model.json is missing)")
        return net

    def pointer(self, name: str) -> dict[str, Any] | None:
        """The pointer ``{"path", "epoch", "score"}`` of ``"best_model"`` or ``"latest_model"`` (None if unsaved)."""
        fs, path = filesystem(join(self.directory, f"{name}.json"))
        if not fs.exists(path):
            return None
        url = join(self.directory, f"{name}.json")
        record = load_json(read_bytes(url, SerializationError), repr(url), SerializationError)
        if not isinstance(record, dict):
            raise SerializationError(f"{url!r} is not a JSON object: the file is damaged; delete it or save again")
        return record

    def _save(self, name: str, network: Network, epoch: int, score: float) -> None:
        old = self.pointer(name)
        sub = f"{name}-{uuid.uuid4().hex[:12]}"
        network.save(join(self.directory, sub), save_updater=self.save_updater)  # 1. the new model, complete
        self._template = network.module if module_spec(network.module) is None else None
        record = {"path": sub, "epoch": epoch, "score": score if math.isfinite(score) else str(score)}
        atomic_write_bytes(
            join(self.directory, f"{name}.json"),
            json.dumps(record).encode(),  # 2. switch
            SerializationError,
        )
        if old is not None and old.get("path") != sub:  # 3. drop the replaced model
            fs, path = filesystem(join(self.directory, str(old["path"])))
            try:
                if fs.exists(path):
                    fs.rm(path, recursive=True)
            except OSError:  # a leftover directory wastes space but is harmless
                log.warning("could not remove the replaced model %s", path, exc_info=True)

    def _load(
        self,
        name: str,
        module: torch.nn.Module | None = None,
        factories: Any = None,
        trust_code: bool = False,
    ) -> Network | None:
        record = self.pointer(name)
        if record is None:
            return None
        sub = str(record.get("path", ""))
        if not sub.startswith(f"{name}-") or "/" in sub or ".." in sub:
            raise SerializationError(f"{name}.json in {self.directory!r} points outside its directory: {sub!r}")
        if module is None and self._template is not None:
            # this process saved it from its own module: read it into a copy of that (its weights are overwritten)
            module = copy.deepcopy(self._template)
        return Network.load(join(self.directory, sub), factories=factories, trust_code=trust_code, module=module)
