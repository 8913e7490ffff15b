"""The model zoo: small reference networks that remember their spec (so they save as JSON, not pickle).

Modules return logits; :meth:`torchspark.Network.output` applies the loss's output activation.
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

from torchspark.errors import ConfigError
from torchspark.nn.spec import attach_spec

__all__ = ["mlp", "lenet"]


def _check_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def mlp(n_in: int, hidden: int | Sequence[int], n_out: int) -> nn.Module:
    """A multi-layer perceptron with ReLU activations; flattens its input first.

    Args:
        n_in: number of input features after flattening (64 for 8x8 digits, 784 for MNIST).
        hidden: width of the hidden layer, or a list of widths (``[]`` gives logistic regression).
        n_out: number of outputs (classes).
    """
    _check_int("n_in", n_in)
    _check_int("n_out", n_out)
    widths = [hidden] if isinstance(hidden, int) else list(hidden)
    for w in widths:
        _check_int("hidden width", w)
    layers: list[nn.Module] = [nn.Flatten()]
    prev = n_in
    for w in widths:
        layers += [nn.Linear(prev, w), nn.ReLU()]
        prev = w
    layers.append(nn.Linear(prev, n_out))
    return attach_spec(nn.Sequential(*layers), "torchspark.models:mlp",
                       {"n_in": n_in, "hidden": widths if not isinstance(hidden, int) else hidden, "n_out": n_out})


def lenet(in_channels: int = 1, n_classes: int = 10, height: int = 28, width: int = 28) -> nn.Module:
    """The seeds' LeNet: conv 5x5 x20, max-pool 2, conv 5x5 x50, max-pool 2, dense 500 (ReLU), output layer.

    Inputs smaller than 16 pixels a side (the 8x8 digits) get 'same' padding on the convolutions so the two
    poolings still leave a 2x2 map; 28x28 inputs use DL4J's unpadded layout (28 -> 24 -> 12 -> 8 -> 4).
    Input shape ``(N, in_channels, height, width)``.
    """
    for name, v in (("in_channels", in_channels), ("n_classes", n_classes), ("height", height), ("width", width)):
        _check_int(name, v)
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
    return attach_spec(module, "torchspark.models:lenet",
                       {"in_channels": in_channels, "n_classes": n_classes, "height": height, "width": width})


