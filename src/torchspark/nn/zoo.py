"""The model zoo: small reference networks that remember their spec (so they save as JSON, not pickle).

:data:`ZOO` is the zoo's one registry. :mod:`torchspark.models` re-exports its factories for users,
:class:`~torchspark.nn.network_spec.NetworkSpec` names them, and :mod:`torchspark.nn.trust` lets a saved file name
them as ``"torchspark.models:<name>"`` (the path their spec records) without importing anything. A new zoo model is a
factory here, an entry in :data:`ZOO` and a re-export in :mod:`torchspark.models`.

Modules return logits; :meth:`torchspark.Network.output` applies the loss's output activation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from torchspark.errors import ConfigError
from torchspark.nn.spec import attach_spec
from torchspark.validation import check_int

__all__ = ["ZOO", "ZOO_MODULE", "zoo_path", "mlp", "lenet"]

#: the module under which users import the zoo, and which saved specs name (``"torchspark.models:mlp"``)
ZOO_MODULE = "torchspark.models"


def zoo_path(name: str) -> str:
    """The import path a zoo model's spec records: ``zoo_path("mlp") == "torchspark.models:mlp"``."""
    return f"{ZOO_MODULE}:{name}"


def mlp(n_in: int, hidden: int | Sequence[int], n_out: int) -> nn.Module:
    """A multi-layer perceptron with ReLU activations; flattens its input first.

    Args:
        n_in: number of input features after flattening (64 for 8x8 digits, 784 for MNIST).
        hidden: width of the hidden layer, or a list of widths (``[]`` gives logistic regression).
        n_out: number of outputs (classes).
    Raises:
        ConfigError: a size that is not an integer >= 1.

    Example: ``mlp(64, [32, 16], 10)`` for 8x8 digits.
    """
    check_int("n_in", n_in, 1)
    check_int("n_out", n_out, 1)
    widths = [hidden] if isinstance(hidden, int) else list(hidden)
    for w in widths:
        check_int("hidden width", w, 1)
    layers: list[nn.Module] = [nn.Flatten()]
    prev = n_in
    for w in widths:
        layers += [nn.Linear(prev, w), nn.ReLU()]
        prev = w
    layers.append(nn.Linear(prev, n_out))
    return attach_spec(
        nn.Sequential(*layers),
        zoo_path("mlp"),
        {"n_in": n_in, "hidden": widths if not isinstance(hidden, int) else hidden, "n_out": n_out},
    )


def lenet(in_channels: int = 1, n_classes: int = 10, height: int = 28, width: int = 28) -> nn.Module:
    """The seeds' LeNet: conv 5x5 x20, max-pool 2, conv 5x5 x50, max-pool 2, dense 500 (ReLU), output layer.

    Inputs smaller than 16 pixels a side (the 8x8 digits) get 'same' padding on the convolutions so the two
    poolings still leave a 2x2 map; 28x28 inputs use DL4J's unpadded layout (28 -> 24 -> 12 -> 8 -> 4).
    Input shape ``(N, in_channels, height, width)``.

    Example: ``lenet(1, 10, 28, 28)`` for MNIST.
    """
    for name, v in (("in_channels", in_channels), ("n_classes", n_classes), ("height", height), ("width", width)):
        check_int(name, v, 1)
    pad = 2 if min(height, width) < 16 else 0

    def after(size: int) -> int:
        size = (size + 2 * pad - 4) // 2  # conv 5x5 then pool 2
        return (size + 2 * pad - 4) // 2

    h, w = after(height), after(width)
    if h < 1 or w < 1:
        raise ConfigError(f"lenet needs inputs of at least 4x4 pixels, got {height}x{width}")
    module = nn.Sequential(
        nn.Conv2d(in_channels, 20, 5, padding=pad),
        nn.MaxPool2d(2),
        nn.Conv2d(20, 50, 5, padding=pad),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(50 * h * w, 500),
        nn.ReLU(),
        nn.Linear(500, n_classes),
    )
    return attach_spec(
        module,
        zoo_path("lenet"),
        {"in_channels": in_channels, "n_classes": n_classes, "height": height, "width": width},
    )


#: zoo name -> factory: the architectures a network spec can name and a saved file may build without trust_code
ZOO: dict[str, Callable[..., nn.Module]] = {"mlp": mlp, "lenet": lenet}
