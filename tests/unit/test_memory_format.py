"""Network(memory_format="channels_last"): NHWC convolution weights that are still views of the flat buffer."""

from __future__ import annotations

import pytest
import torch

from helpers import lenet_net
from torchspark import Network, datasets, optim
from torchspark.errors import ConfigError


def _net(fmt: str) -> Network:
    return lenet_net(updater=optim.Adam(lr=1e-3), side=12, memory_format=fmt)


def test_channels_last_weights_are_views_of_the_flat_buffer() -> None:
    net = _net("channels_last")
    convs = [p for p in net.module.parameters() if p.dim() == 4]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    assert not any(p.is_contiguous() for p in convs if p.shape[1] > 1)
    before = [p.detach().clone() for p in net.module.parameters()]
    net.params_view().add_(1.0)  # writes through the flat buffer reach every weight
    for p, b in zip(net.module.parameters(), before):
        torch.testing.assert_close(p.detach(), b + 1.0)
    flat = net.params()
    net.set_params(torch.zeros_like(flat))
    assert all(float(p.detach().abs().sum()) == 0.0 for p in net.module.parameters())
    net.set_params(flat)
    torch.testing.assert_close(net.params(), flat, atol=0, rtol=0)


def test_channels_last_trains_like_contiguous_up_to_rounding() -> None:
    data = datasets.synthetic_images(128, 1, 12, 12, n_classes=10, seed=1)
    a, b = _net("contiguous"), _net("channels_last")
    for pa, pb in zip(a.module.parameters(), b.module.parameters()):
        assert torch.equal(pa, pb), "same seed, same logical weights"
    a.fit(data, epochs=2, batch_size=16)
    b.fit(data, epochs=2, batch_size=16)
    start = _net("contiguous").module.parameters()
    moved = max(float((pa - pi).detach().abs().max()) for pa, pi in zip(a.module.parameters(), start))
    assert moved > 1e-3, "training must have changed the weights"
    for pa, pb in zip(a.module.parameters(), b.module.parameters()):
        torch.testing.assert_close(pa, pb, atol=2e-4, rtol=0)
    # a step leaves no gradients behind; one backward shows the channels-last weights get channels-last gradients
    b.module(data.features[:4]).sum().backward()
    assert all(p.grad.is_contiguous(memory_format=torch.channels_last) for p in b.module.parameters() if p.dim() == 4)


def test_copy_save_and_load_keep_the_layout_and_values(tmp_path) -> None:
    net = _net("channels_last")
    net.fit(datasets.synthetic_images(32, 1, 12, 12, n_classes=10, seed=2), batch_size=16)
    for other in (net.copy(), Network.load(net.save(str(tmp_path / "m")))):
        assert other.memory_format == "channels_last"
        assert all(
            p.is_contiguous(memory_format=torch.channels_last) for p in other.module.parameters() if p.dim() == 4
        )
        torch.testing.assert_close(other.params(), net.params(), atol=0, rtol=0)
        torch.testing.assert_close(other.updater_state(), net.updater_state(), atol=0, rtol=0)


def test_bad_memory_format_names_the_value() -> None:
    with pytest.raises(
        ConfigError, match=r"memory_format must be one of \['contiguous', 'channels_last'\], got 'nhwc'"
    ):
        _net("nhwc")


class _ViewAfterConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).view(x.shape[0], -1))


class _Broken(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_forward_errors_are_named_for_what_they_are() -> None:
    from torchspark import DataSet
    from torchspark.errors import DataError

    batch = DataSet(torch.rand(2, 3, 8, 8), torch.zeros(2, dtype=torch.long))
    net = Network(_ViewAfterConv(), memory_format="channels_last", seed=0)
    with pytest.raises(ConfigError, match=r"calls \.view\(\).*use \.reshape\(\).*memory_format='contiguous'"):
        net.train_step(batch)
    Network(_ViewAfterConv(), seed=0).train_step(batch)  # fine with the default layout
    with pytest.raises(DataError, match=r"cannot take features of shape \(2, 3, 5, 5\)"):
        Network(_ViewAfterConv(), seed=0).train_step(DataSet(torch.rand(2, 3, 5, 5), torch.zeros(2, dtype=torch.long)))
    with pytest.raises(RuntimeError, match="illegal memory access") as info:
        Network(_Broken(), seed=0).train_step(DataSet(torch.rand(2, 4), torch.zeros(2, dtype=torch.long)))
    assert not isinstance(info.value, DataError), "a failure inside the module is not blamed on the data"
