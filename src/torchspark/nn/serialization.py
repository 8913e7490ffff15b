"""Saving and loading [`Network`][torchspark.Network], and the in-memory blueprint that ships one to workers.

The format (a directory of ``config.json`` and safetensors files) and the building are
`torchspark.nn.portable`'s; this module binds them to ``Network``: [`load_network`][torchspark.nn.load_network] returns one and
[`NetworkBlueprint.build`][torchspark.nn.NetworkBlueprint.build] builds one.
"""

from __future__ import annotations

import torch

from torchspark.nn.network import Network
from torchspark.nn.portable import Blueprint, check_save_target, read_network, save_network
from torchspark.nn.trust import Factories

__all__ = ["save_network", "load_network", "check_save_target", "NetworkBlueprint"]


def load_network(
    path: str,
    allow_pickle: bool = False,
    factories: Factories = None,
    trust_code: bool = False,
    module: torch.nn.Module | None = None,
) -> Network:
    """Load a network written by [`save_network`][torchspark.nn.save_network].

    Args:
        path: the model directory (local path or fsspec URL).
        allow_pickle: also load ``objects.pkl`` (parts saved with ``allow_pickle=True``). Unpickling runs code, so
            this trusts the file completely and implies ``trust_code``.
        factories: functions ``config.json`` may name besides torchspark's zoo: module factories you built the
            network with (``from_factory("mypkg.models:build", ...)`` -> ``factories=[build]``), module classes of
            yours saved by their import path (``factories=[MyNet]``) and custom loss
            functions saved by import path. A list (each named by its ``module:qualname``) or a
            ``{"pkg.mod:fn": fn}`` mapping.
        trust_code: import and call any function ``config.json`` names. Only for files you trust as you trust
            code: a hostile ``config.json`` could name ``"os:system"``.
        module: a module you built (``MyNet(...)``, as it was when saved) to load the weights into, instead of
            building the one ``config.json`` names: needs no trust and works for every saved network.
    Raises:
        SerializationError: missing or damaged files, pickle not allowed, a name ``config.json`` gives that is
            not allowed (nothing is imported then), a module class that cannot be imported or was saved without
            the arguments it needs (pass ``module=``), or weights that do not fit the module (each missing,
            unexpected or differently shaped tensor named with its shapes).

    Example: ``net = load_network("models/m1", factories=[MyNet])``, or
    ``load_network("models/m1", module=MyNet(4, hidden=16))``.
    """
    return read_network(
        Network, path, allow_pickle=allow_pickle, factories=factories, trust_code=trust_code, module=module
    )


class NetworkBlueprint(Blueprint):
    """Everything needed to rebuild a [`Network`][torchspark.Network] on a worker: JSON config, weights, updater
    and extra state (see `Blueprint`).

    Example: ``blob = NetworkBlueprint.of(net).to_bytes()`` on the driver,
    ``NetworkBlueprint.from_bytes(blob).build("cuda:0")`` on a worker.
    """

    def build(self, device: str | torch.device | None = None) -> Network:
        """A fresh network with these weights and state (on ``device``)."""
        return self.build_as(Network, device)
