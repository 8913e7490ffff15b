"""The model zoo: small reference networks that remember their spec (so they save as JSON, not pickle).

``models.mlp(64, 32, 10)``, ``models.lenet(1, 10, 28, 28)``; real-size networks: ``models.vgg(3, 10)`` (11.7 M
parameters, 32x32 RGB images) and ``models.text_transformer(20000, 4)`` (6.2 M parameters, token sequences). The factories and the registry [`ZOO`][torchspark.models.ZOO] live in
`torchspark.nn.zoo`; this module is their public name (saved specs record ``"torchspark.models:<name>"``).
Modules return logits; [`torchspark.Network.output`][torchspark.Network.output] applies the loss's output activation.
"""

from __future__ import annotations

from torchspark.nn.zoo import ZOO, TextTransformer, lenet, mlp, text_transformer, vgg

__all__ = ["mlp", "lenet", "vgg", "text_transformer", "TextTransformer", "ZOO"]
