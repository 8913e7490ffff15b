"""The model zoo: small reference networks that remember their spec (so they save as JSON, not pickle).

[`ZOO`][torchspark.models.ZOO] is the zoo's one registry. [`torchspark.models`][torchspark.models] re-exports its factories for users,
[`NetworkSpec`][torchspark.spark.ml.NetworkSpec] names them, and `torchspark.nn.trust` lets a saved file name
them as ``"torchspark.models:<name>"`` (the path their spec records) without importing anything. A new zoo model is a
factory here, an entry in [`ZOO`][torchspark.models.ZOO] and a re-export in [`torchspark.models`][torchspark.models].

Modules return logits; [`torchspark.Network.output`][torchspark.Network.output] applies the loss's output activation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from torchspark.errors import ConfigError, DataError
from torchspark.nn.spec import attach_spec
from torchspark.validation import check_bool, check_float, check_int

__all__ = ["ZOO", "ZOO_MODULE", "zoo_path", "mlp", "lenet", "vgg", "text_transformer", "TextTransformer"]

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
    """DL4J's LeNet example: conv 5x5 x20, max-pool 2, conv 5x5 x50, max-pool 2, dense 500 (ReLU), output layer.

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


def vgg(
    in_channels: int = 3,
    n_classes: int = 10,
    widths: Sequence[int] = (32, 64, 128, 256, 1024),
    convs_per_stage: int = 2,
    hidden: int = 512,
    batch_norm: bool = True,
) -> nn.Module:
    """A VGG-style image classifier: stages of 3x3 convolutions (+ batch norm) + ReLU, each stage halving the image.

    The defaults make a 13.5 M-parameter network for 32x32x3 images (CIFAR-sized): five stages of two convolutions
    (32, 64, 128, 256, 1024 channels; 32 -> 16 -> 8 -> 4 -> 2 pixels), then global average pooling, a dense layer
    of ``hidden`` units and the output layer. Most parameters sit in the last stage, where the image is 2x2, so the
    forward pass costs about 0.2 GFLOP per image while the update to exchange is 54 MB (float32): the workload of
    a real-size network on a CPU budget. Batch norm's running statistics are buffers, which both masters carry.
    Input shape ``(N, in_channels, H, W)``, any H and W (the pooling is global).

    Args:
        in_channels: image channels (3 for RGB).
        n_classes: number of outputs (classes).
        widths: channels of each stage; every stage but the last ends with a 2x2 max-pool. Fewer or narrower
            stages make a smaller network (``widths=(16, 32)`` for a quick test).
        convs_per_stage: 3x3 convolutions per stage (VGG uses 2-4).
        hidden: width of the dense layer before the output (0: none).
        batch_norm: batch norm after each convolution (trains faster; adds running-statistics buffers).
    Raises:
        ConfigError: a size that is not an integer >= 1 (``hidden`` >= 0), or no stage.

    Example: ``vgg(3, 10)`` for 32x32 RGB images; ``vgg(3, 10, widths=(32, 64), hidden=0)`` for a small one.
    """
    for name, v in (("in_channels", in_channels), ("n_classes", n_classes), ("convs_per_stage", convs_per_stage)):
        check_int(name, v, 1)
    check_int("hidden", hidden, 0)
    check_bool("batch_norm", batch_norm, owner="vgg")
    stages = list(widths)
    if not stages:
        raise ConfigError("vgg needs at least one stage width, got widths=[]; pass e.g. widths=[64, 128]")
    layers: list[nn.Module] = []
    prev = in_channels
    for i, w in enumerate(stages):
        check_int("vgg stage width", w, 1)
        for _ in range(convs_per_stage):
            layers += [nn.Conv2d(prev, w, 3, padding=1, bias=not batch_norm)]
            layers += [nn.BatchNorm2d(w)] if batch_norm else []
            layers.append(nn.ReLU())
            prev = w
        if i < len(stages) - 1:
            layers.append(nn.MaxPool2d(2, ceil_mode=True))  # ceil: odd sizes never shrink to 0
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    if hidden:
        layers += [nn.Linear(prev, hidden), nn.ReLU()]
        prev = hidden
    layers.append(nn.Linear(prev, n_classes))
    kwargs = {
        "in_channels": in_channels,
        "n_classes": n_classes,
        "widths": stages,
        "convs_per_stage": convs_per_stage,
        "hidden": hidden,
        "batch_norm": batch_norm,
    }
    return attach_spec(nn.Sequential(*layers), zoo_path("vgg"), kwargs)


class TextTransformer(nn.Module):
    """Token embedding + learned positions, pre-norm transformer encoder layers, mean pooling, a linear head.

    Input: token ids ``(N, T)`` (int64, ``T <= max_len``); output: logits ``(N, n_classes)``. Build it with
    [`text_transformer`][torchspark.models.text_transformer], which records the spec.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        d_model: int,
        n_heads: int,
        n_layers: int,
        d_ff: int,
        n_classes: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, batch_first=True, norm_first=True)
        # no nested tensors: sequences have no padding mask, and the flag only warns with norm_first
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def reset_parameters(self) -> None:
        """Re-draw the attention's input projections (the one part no submodule's ``reset_parameters`` covers), so
        [`Network`][torchspark.Network]'s ``seed`` re-initialises every parameter (it calls each module's reset)."""
        for layer in self.encoder.layers:
            nn.init.xavier_uniform_(layer.self_attn.in_proj_weight)
            nn.init.zeros_(layer.self_attn.in_proj_bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise DataError(
                f"TextTransformer takes integer token ids shaped (N, T), got {tuple(tokens.shape)} "
                f"{str(tokens.dtype).removeprefix('torch.')}; pass features as int64 token ids"
            )
        t = tokens.shape[1]  # tokens: (N, T)
        if t > self.positions.num_embeddings:
            raise DataError(
                f"sequences of {t} tokens are longer than max_len={self.positions.num_embeddings}; "
                "build the model with a larger max_len or cut the sequences"
            )
        x = self.tokens(tokens) + self.positions(torch.arange(t, device=tokens.device))  # (N, T, D)
        x = self.encoder(x)  # (N, T, D)
        return self.head(self.norm(x.mean(dim=1)))  # mean pooling -> (N, D) -> (N, C)


def text_transformer(
    vocab_size: int = 20000,
    n_classes: int = 4,
    max_len: int = 64,
    d_model: int = 256,
    n_heads: int = 4,
    n_layers: int = 2,
    d_ff: int = 512,
    dropout: float = 0.0,
) -> nn.Module:
    """A small transformer text classifier ([`TextTransformer`][torchspark.models.TextTransformer]): embeddings, encoder layers, mean pooling.

    The defaults make a 6.2 M-parameter network whose token embedding (20,000 x 256 = 5.1 M) dominates: a minibatch
    touches only the rows of the tokens it contains, so most of the embedding's gradient is zero in a step, the
    sparse update that threshold encoding (gradient sharing) sends cheaply. Pair it with
    [`torchspark.datasets.synthetic_keywords`][torchspark.datasets.synthetic_keywords].

    Args:
        vocab_size: token ids are in ``[0, vocab_size)``.
        n_classes: number of outputs (classes).
        max_len: the longest sequence (learned positions).
        d_model: embedding width; ``n_heads`` must divide it.
        n_heads: attention heads.
        n_layers: encoder layers (pre-norm, ReLU feed-forward of ``d_ff`` units).
        dropout: dropout in the encoder layers; 0 (the default) keeps runs bit-reproducible across runners.
    Raises:
        ConfigError: a size that is not an integer >= 1, ``n_heads`` not dividing ``d_model``, or a dropout outside
            [0, 1).

    Example: ``text_transformer(20000, 4)``; ``text_transformer(1000, 2, d_model=32, d_ff=64)`` for a quick test.
    """
    sizes = {
        "vocab_size": vocab_size,
        "n_classes": n_classes,
        "max_len": max_len,
        "d_model": d_model,
        "n_heads": n_heads,
        "n_layers": n_layers,
        "d_ff": d_ff,
    }
    for name, v in sizes.items():
        check_int(name, v, 1)
    if d_model % n_heads:
        raise ConfigError(
            f"text_transformer: n_heads must divide d_model, got d_model={d_model}, n_heads={n_heads}; "
            f"use e.g. n_heads={next(h for h in (8, 4, 2, 1) if d_model % h == 0)}"
        )
    dropout = float(check_float("dropout", dropout, minimum=0.0, below=1.0, owner="text_transformer"))
    module = TextTransformer(vocab_size, max_len, d_model, n_heads, n_layers, d_ff, n_classes, dropout)
    return attach_spec(module, zoo_path("text_transformer"), {**sizes, "dropout": dropout})


#: zoo name -> factory: the architectures a network spec can name and a saved file may build without trust_code
ZOO: dict[str, Callable[..., nn.Module]] = {
    "mlp": mlp,
    "lenet": lenet,
    "vgg": vgg,
    "text_transformer": text_transformer,
}
