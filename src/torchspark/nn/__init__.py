"""Networks: a PyTorch module with its loss, updater, flat views for distributed training, and save/load."""

from torchspark.nn.losses import LOSSES, Loss
from torchspark.nn.network import Network
from torchspark.nn.precision import PRECISIONS, Precision
from torchspark.nn.serialization import NetworkBlueprint, load_network, save_network
from torchspark.nn.spec import capture, from_factory, module_spec

__all__ = [
    "Network",
    "NetworkBlueprint",
    "Loss",
    "LOSSES",
    "Precision",
    "PRECISIONS",
    "from_factory",
    "capture",
    "module_spec",
    "save_network",
    "load_network",
]
