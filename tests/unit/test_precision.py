"""Mixed precision (``Network(precision=...)``): autocast in the forward pass, float32 outputs and master weights,
fp16's gradient scaler (skipped steps, unscaling before clipping, its state saved and restored), bf16 accuracy on
the digits, and the codec taking half-precision updates."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import classification_batches, mlp_net
from torchspark import DataSet, Network, datasets, models, optim
from torchspark.encoding import (
    EncoderConfig,
    EncoderState,
    FixedThreshold,
    decode,
    encode_step,
    threshold_encode,
    to_bytes,
)
from torchspark.errors import ConfigError, SerializationError
from torchspark.nn import NetworkBlueprint
from torchspark.nn.network_spec import NetworkSpec
from torchspark.nn.precision import SCALER_KEYS

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DtypeRecorder(nn.Module):
    """An MLP that records the dtype of its hidden activations on every forward call."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(12, 16), nn.Linear(16, 3)
        self.seen: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.hidden(x)
        self.seen.append(h.dtype)
        return self.out(torch.relu(h))


def _scaler(net: Network) -> tuple[float, int]:
    state = net.amp.state_tensors()
    return float(state[SCALER_KEYS[0]]), int(state[SCALER_KEYS[1]])


def _set_scaler(net: Network, scale: float, tracker: int = 0) -> None:
    net.amp.load_state_tensors({SCALER_KEYS[0]: torch.tensor([scale]), SCALER_KEYS[1]: torch.tensor([tracker])})


# ------------------------------------------------------------------ the option
@pytest.mark.parametrize("bad", ["fp8", "FP16", "float16", None, 16])
def test_an_unknown_precision_is_a_config_error_naming_the_value_and_the_fix(bad) -> None:
    with pytest.raises(ConfigError, match=rf"precision must be one of \['fp32', 'bf16', 'fp16'\], got {bad!r}.*bf16"):
        mlp_net(12, 16, 3, precision=bad)
    with pytest.raises(ConfigError, match=rf"network spec: precision must be one of .*got {bad!r}"):
        NetworkSpec("mlp", {"n_in": 12, "hidden": 16, "n_out": 3}, precision=bad)


def test_a_saved_config_with_an_unknown_precision_is_refused_on_load(tmp_path) -> None:
    import json

    path = str(tmp_path / "m")
    mlp_net(12, 16, 3).save(path)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["precision"] == "fp32"
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "precision": "fp8"}))
    with pytest.raises(SerializationError, match="precision must be one of .*got 'fp8'"):
        Network.load(path)


def test_a_network_spec_builds_at_its_precision_and_round_trips_it() -> None:
    spec = NetworkSpec("mlp", {"n_in": 12, "hidden": 16, "n_out": 3}, precision="bf16")
    assert NetworkSpec.from_json(spec.to_json()) == spec
    assert spec.build().precision == "bf16" and NetworkSpec("mlp", {"n_in": 2}).precision == "fp32"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_forward_pass_runs_at_the_precision_and_outputs_are_float32(precision: str) -> None:
    recorder = DtypeRecorder()
    net = Network(recorder, updater=optim.SGD(lr=0.1), seed=0, precision=precision)
    batch = classification_batches(1, seed=0, size=8)[0]
    expected = HALF.get(precision, torch.float32)
    net.train_step(batch)
    probs = net.output(batch.features)
    evaluation = net.evaluate(batch)
    per_example = net.score_examples(batch)
    assert recorder.seen == [expected] * 4  # training, output, evaluate, score
    assert probs.dtype == per_example.dtype == torch.float32
    assert evaluation.accuracy() >= 0 and torch.allclose(probs.sum(1), torch.ones(8), atol=1e-5)
    # the master weights, the flat views and the updater stay float32
    assert net.params().dtype == net.params_view().dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in net.module.parameters())


def test_one_bf16_step_differs_from_fp32_and_stays_close() -> None:
    batch = classification_batches(1, seed=1, size=32)[0]
    nets = {p: mlp_net(12, 16, 3, updater=optim.SGD(lr=0.5), precision=p) for p in ("fp32", "bf16")}
    start = nets["fp32"].params()
    assert torch.equal(start, nets["bf16"].params())
    losses = {p: net.train_step(batch) for p, net in nets.items()}
    assert losses["fp32"] != losses["bf16"] and losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)
    step = (nets["fp32"].params() - start).norm()
    delta = (nets["fp32"].params() - nets["bf16"].params()).norm()
    assert 0 < delta < 0.05 * step, (delta, step)  # bf16 keeps ~3 significant digits: ~2% here


def test_bf16_digits_accuracy_is_within_half_a_point_of_fp32() -> None:
    train, test = datasets.digits("train"), datasets.digits("test")
    accuracy, params = {}, {}
    for precision in ("fp32", "bf16"):
        net = Network(models.mlp(64, 32, 10), updater=optim.Adam(lr=1e-2), seed=0, precision=precision)
        net.fit(train, epochs=3, batch_size=32)
        accuracy[precision], params[precision] = net.evaluate(test).accuracy(), net.params()
    assert accuracy["fp32"] > 0.9
    assert abs(accuracy["bf16"] - accuracy["fp32"]) <= 0.005, accuracy
    assert not torch.allclose(params["fp32"], params["bf16"], atol=1e-3), "bf16 must have trained differently"


# ------------------------------------------------------------------ fp16's gradient scaler
def test_fp16_skips_a_step_whose_gradients_overflow_without_error_and_counts_the_minibatch() -> None:
    net = mlp_net(12, 16, 3, updater=optim.Adam(lr=1e-2), precision="fp16")
    batch = classification_batches(1, seed=2, size=16)[0]
    _set_scaler(net, 2.0**40)  # the scaled gradients overflow fp16's 65504
    params, state = net.params(), net.updater_state()
    loss = net.train_step(batch)
    assert torch.isfinite(torch.tensor(loss)) and net.last_score == loss
    assert torch.equal(net.params(), params) and torch.equal(net.updater_state(), state)  # no step taken
    assert net.iteration == 1 and net.amp.skipped_steps == 1
    assert _scaler(net) == (2.0**39, 0)  # halved
    _set_scaler(net, 1024.0)
    net.train_step(batch)
    assert not torch.equal(net.params(), params) and net.amp.skipped_steps == 1 and _scaler(net) == (1024.0, 1)


def test_fp16_unscales_before_gradient_clip_and_l1() -> None:
    batch = classification_batches(1, seed=3, size=32)[0]
    nets = {
        p: mlp_net(12, 16, 3, updater=optim.SGD(lr=1.0), precision=p, gradient_clip=0.01, l1=1e-3)
        for p in ("fp32", "fp16")
    }
    _set_scaler(nets["fp16"], 1024.0)
    start = nets["fp32"].params()
    for net in nets.values():
        net.train_step(batch)
    steps = {p: start - net.params() for p, net in nets.items()}
    assert nets["fp16"].amp.skipped_steps == 0
    # clipped to norm 0.01 plus lr * l1 * sign(w) per weight: equal up to fp16's rounding of the gradient direction;
    # clipping the scaled gradients would have given a step ~1000x smaller
    torch.testing.assert_close(steps["fp16"], steps["fp32"], atol=2e-4, rtol=0)
    assert steps["fp32"].norm() > 1e-3


def test_the_scaler_state_is_saved_with_the_updater_and_travels_in_copies_and_blueprints(tmp_path) -> None:
    net = mlp_net(12, 16, 3, updater=optim.Adam(lr=1e-2), precision="fp16")
    for batch in classification_batches(3, seed=4, size=8):
        net.train_step(batch)
    _set_scaler(net, 512.0, 7)
    path = str(tmp_path / "m")
    net.save(path)
    shipped = NetworkBlueprint.from_bytes(NetworkBlueprint.of(net).to_bytes()).build()
    for twin in (Network.load(path), net.copy(), shipped):
        assert twin.precision == "fp16" and _scaler(twin) == (512.0, 7)
        torch.testing.assert_close(twin.updater_state(), net.updater_state(), rtol=0, atol=0)
    net.save(path, save_updater=False)
    assert _scaler(Network.load(path)) == (65536.0, 0)  # without the updater: a fresh scaler, like a fresh Adam
    for precision in ("fp32", "bf16"):
        other = mlp_net(12, 16, 3, precision=precision)
        other.save(path)
        loaded = Network.load(path)
        assert loaded.precision == precision and loaded.amp.state_tensors() == {} and loaded.amp.scaler is None


# ------------------------------------------------------------------ the codec
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_update_encodes_as_its_float32_cast_into_a_float32_residual(dtype) -> None:
    g = torch.Generator().manual_seed(0)
    update = (torch.randn(1000, generator=g) * 1e-2).to(dtype)
    for threshold in (1e-2, 3e-3):  # a sparse and a bitmap message
        half_residual, float_residual = torch.zeros(1000), torch.zeros(1000)
        for _ in range(3):  # the residual carries what was not sent between steps
            a = threshold_encode(update, half_residual, threshold)
            b = threshold_encode(update.float(), float_residual, threshold)
            assert to_bytes(a) == to_bytes(b)
        assert half_residual.dtype == torch.float32 and torch.equal(half_residual, float_residual)
        assert decode(a, torch.zeros(1000)).dtype == torch.float32
    config = EncoderConfig(threshold_policy=FixedThreshold(1e-2))
    states = [EncoderState.create(config, 1000) for _ in range(2)]
    (m1, s1), (m2, s2) = encode_step(update, states[0], 0), encode_step(update.float(), states[1], 0)
    assert to_bytes(m1) == to_bytes(m2) and torch.equal(s1.residual, s2.residual)


def test_a_bf16_network_trains_on_a_dataset_of_float64_features() -> None:
    data = DataSet(torch.randn(32, 12, dtype=torch.float64), torch.randint(0, 3, (32,)))
    net = mlp_net(12, 16, 3, precision="bf16")
    net.fit(data, epochs=1, batch_size=16)
    assert net.iteration == 2 and net.output(data.features).dtype == torch.float32


# ------------------------------------------------------------------ the command line
def test_the_precision_flag_and_config_key_reach_the_trained_network(tmp_path, capsys) -> None:
    import json

    from torchspark.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--precision", "fp8"])
    assert info.value.code == 2 and "invalid choice: 'fp8'" in capsys.readouterr().err
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"precision": "fp16"}))
    assert main(["train", "--config", str(config), "--print-config", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["precision"] == "fp16"
    out = tmp_path / "bf16"
    assert (
        main(
            [
                "train",
                "--parallel",
                "--training-mode",
                "averaging",
                "--epochs",
                "1",
                "--no-progress",
                "--precision",
                "bf16",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    assert Network.load(str(out / "model")).precision == "bf16"
    assert json.loads((out / "metrics.json").read_text())["precision"] == "bf16"
