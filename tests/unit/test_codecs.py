"""The compressor slot of gradient sharing: the top-k codec trains with replicas bit-identical, its options are
honoured, and codec names are validated."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_replicas_identical, classification_batches, fit_in_process, mlp_net
from torchspark import SharedTrainingMaster, optim
from torchspark.encoding import (
    COMPRESSORS,
    EncoderConfig,
    EncoderState,
    FixedThreshold,
    ThresholdCompressor,
    TopKCompressor,
    compressor_from_dict,
    encode_step,
    to_bytes,
)
from torchspark.errors import ConfigError, EncodingError
from torchspark.training.algorithms.sharing.settings import SharingSettings


def _fit(codec: object, shards: list, epochs: int = 2, overlap: bool = True):
    net = mlp_net(12, 16, 3, updater=optim.SGD(lr=0.1, momentum=0.9))
    settings = SharingSettings(EncoderConfig(), overlap=overlap, codec=codec).to_dict()
    results = fit_in_process(net, "sharing", settings, shards, epochs=epochs, timeout_s=30.0)
    return net, results


@pytest.mark.parametrize("overlap", [True, False])
def test_topk_trains_two_workers_with_identical_replicas(overlap: bool) -> None:
    shards = [classification_batches(6, seed=1), classification_batches(6, seed=2)]
    start = mlp_net(12, 16, 3).params()
    net, results = _fit(TopKCompressor(ratio=0.05), shards, overlap=overlap)
    assert_replicas_identical(results, 2, net=net)  # every rank's parameter checksum, and the driver's model
    assert net.extra_config["sharing.codec"] == "topk"
    assert not torch.equal(net.params(), start)  # it trained
    k = TopKCompressor(ratio=0.05).entries(net.num_params())
    steps = 12 * 2
    # every step of both workers sends one flag byte + a 24-byte header + k indices and values; each worker ends
    # each epoch with a 1-byte "my data ran out" payload
    assert net.extra_config["sharing.bytes_sent"] == steps * (1 + 24 + 8 * k) + 2 * 2


def test_topk_k_changes_the_bytes_sent() -> None:
    shards = [classification_batches(4, seed=1), classification_batches(4, seed=2)]
    small, _ = _fit(TopKCompressor(k=5), shards, epochs=1)
    large, _ = _fit(TopKCompressor(k=50), shards, epochs=1)
    assert small.extra_config["sharing.bytes_sent"] < large.extra_config["sharing.bytes_sent"]
    assert large.extra_config["sharing.bytes_sent"] - small.extra_config["sharing.bytes_sent"] == 8 * 45 * 8
    assert not torch.equal(small.params(), large.params())


def test_topk_error_feedback_keeps_every_update() -> None:
    """What is not sent stays in the residual: decoded messages + residual = the sum of the updates."""
    codec = TopKCompressor(k=3)
    state = codec.start(torch.zeros(20), None)
    g = torch.Generator().manual_seed(0)
    updates = [torch.randn(20, generator=g) for _ in range(4)]
    total = torch.zeros(20)
    for step, update in enumerate(updates):
        message, state = codec.encode(update, state, step)
        data = codec.to_bytes(message)
        assert len(data) == message.nbytes == 24 + 8 * 3
        codec.decode(data, total)
    torch.testing.assert_close(total + state.residual, torch.stack(updates).sum(0))
    with pytest.raises(EncodingError, match="21 parameters"):
        codec.decode(data, torch.zeros(21))
    with pytest.raises(EncodingError, match="top-k"):
        codec.decode(data[:-1], torch.zeros(20))


def test_threshold_codec_is_encode_step_and_its_wire_format() -> None:
    config = EncoderConfig(threshold_policy=FixedThreshold(0.5))
    codec = ThresholdCompressor(config)
    update = torch.randn(50, generator=torch.Generator().manual_seed(1))
    mine, state = codec.encode(update, codec.start(torch.zeros(50), None), 0)
    theirs, _ = encode_step(update, EncoderState.create(config, 50), 0)
    assert codec.to_bytes(mine) == to_bytes(theirs)
    out = codec.decode(codec.to_bytes(mine), torch.zeros(50))
    assert int((out != 0).sum()) == mine.num_entries > 0


def test_codec_names_and_options_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"\['threshold', 'topk'\]"):
        SharedTrainingMaster(codec="zstd")
    with pytest.raises(ConfigError, match="ratio"):
        SharedTrainingMaster(codec=TopKCompressor(ratio=0))
    with pytest.raises(ConfigError, match="k must be an integer >= 1"):
        compressor_from_dict({"type": "topk", "k": 0})
    with pytest.raises(ConfigError, match="max_staleness"):
        SharedTrainingMaster(codec="topk", max_staleness=1)
    master = SharedTrainingMaster(codec={"type": "topk", "k": 7})
    assert master.codec == TopKCompressor(k=7)
    assert SharedTrainingMaster.from_json(master.to_json()).codec == TopKCompressor(k=7)
    assert SharingSettings.from_dict(master.algorithm_settings()).codec == TopKCompressor(k=7)
    # the threshold default keeps the settings' old form
    assert "codec" not in SharedTrainingMaster().algorithm_settings()
    assert sorted(COMPRESSORS) == ["threshold", "topk"]
