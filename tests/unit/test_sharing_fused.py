"""The fused hot path of gradient sharing against the unfused reference steps it replaces (bit for bit)."""

from __future__ import annotations

import threading

import pytest
import torch

from reference_loops import dense_exchange, sparse_exchange
from torchspark import DataSet, Network, datasets, models, optim
from torchspark.encoding import (
    AdaptiveThreshold,
    EncoderConfig,
    EncoderState,
    accumulate_step,
    decode_sum,
    encode_step,
    sparse_decode_sum,
    threshold_encode,
    to_bytes,
)
from torchspark.errors import ConfigError, EncodingError
from torchspark.training import ThreadGroup
from torchspark.training.algorithms.sharing import rounds
from torchspark.training.algorithms.sharing.fused import (
    PARAM_NORM_EVERY,
    can_fuse,
    can_step_into,
    step_into_residual,
    train_step_into,
)
from torchspark.training.algorithms.sharing.loop import _apply
from torchspark.training.algorithms.sharing.state import SharingState


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().numpy().tobytes()


@pytest.mark.parametrize("force_torch", [False, True], ids=["numpy", "torch"])
def test_accumulate_step_equals_the_unfused_steps(force_torch: bool) -> None:
    g = torch.Generator().manual_seed(0)
    before = torch.randn(10_001, generator=g)
    after = before - torch.randn(10_001, generator=g) * 1e-3
    residual = torch.randn(10_001, generator=g) * 1e-2
    want_update = before - after
    want_residual = residual.clone().add_(want_update)
    update = torch.full_like(before, 7.0)  # stale contents must not matter
    live = after.clone()
    update_norm, param_norm = accumulate_step(residual, before, live, update, _force_torch=force_torch)
    assert _bits(update) == _bits(want_update)
    assert _bits(residual) == _bits(want_residual)
    assert _bits(live) == _bits(before)  # the parameters are restored
    assert update_norm == pytest.approx(float(want_update.norm()), rel=1e-5)
    assert param_norm == pytest.approx(float(before.norm()), rel=1e-5)


def test_accumulate_step_reports_non_finite_updates_and_refuses_mismatched_buffers() -> None:
    before = torch.zeros(8)
    after = before.clone()
    after[3] = float("nan")
    update_norm, _ = accumulate_step(torch.zeros(8), before, after, torch.empty(8))
    assert update_norm != update_norm  # NaN
    with pytest.raises(EncodingError, match="update has 7 elements"):
        accumulate_step(torch.zeros(8), before, after, torch.empty(7))


def _messages(length: int) -> list:
    """Sparse messages with overlapping entries and thresholds whose float32 sum depends on the order of addition."""
    out = []
    # at element 5: (0 + 1) + 1e8 - 1e8 = 0 in float32, but (0 - 1e8) + 1e8 + 1 = 1
    for seed, t, sign in ((0, 1.0, 1), (1, 1e8, 1), (2, 1e8, -1)):
        g = torch.Generator().manual_seed(seed)
        update = torch.randn(length, generator=g) * 3 * t
        update[torch.rand(length, generator=g) > 0.05] = 0
        update[5] = sign * 1.5 * t
        out.append(threshold_encode(update, torch.zeros(length), t))
    assert all(m.format == "sparse" for m in out)
    return out


def test_sparse_decode_sum_equals_dense_decode_then_subtract() -> None:
    length = 4_000
    messages = _messages(length)
    params = torch.randn(length)
    want = params - decode_sum(messages, torch.zeros(length))
    indices, sums = sparse_decode_sum(messages)
    got = params.clone()
    got[indices] -= sums
    assert _bits(got) == _bits(want)
    reversed_order = params - decode_sum(messages[::-1], torch.zeros(length))
    assert _bits(reversed_order) != _bits(want)  # the order of additions matters for these values, and is kept


@pytest.mark.parametrize("workers", [2, 3, 12])
def test_sparse_decode_sum_of_many_overlapping_messages_keeps_the_order_of_additions(workers: int) -> None:
    """Up to 12 messages sharing indices (up to 4-5 messages at one index), each with its own threshold
    (magnitudes 1e-3..1e5, so the float32 sums depend on the order): the union sum equals decoding message after
    message into zeros, bit for bit."""
    length = 4_000
    messages = []
    for w in range(workers):
        g = torch.Generator().manual_seed(100 + w)
        t = float(10.0 ** (w % 9 - 3))
        update = torch.randn(length, generator=g) * 3 * t
        update[torch.rand(length, generator=g) > 0.05] = 0  # ~4% density each (sparse wins below 6.25%)
        messages.append(threshold_encode(update, torch.zeros(length), t))
    assert all(m.format == "sparse" for m in messages)
    want = decode_sum(messages, torch.zeros(length))
    indices, sums = sparse_decode_sum(messages)
    got = torch.zeros(length)
    got[indices] = sums
    assert _bits(got) == _bits(want)
    assert bool((indices[1:] > indices[:-1]).all())  # ascending, unique
    sent = torch.zeros(length, dtype=torch.int64)
    for m in messages:
        sent[m.payload.abs().long() - 1] += 1
    assert torch.equal(indices, torch.nonzero(sent).squeeze(1))  # exactly the union
    if workers == 12:
        assert int(sent.max()) >= 3  # the column-by-column loop ran past its second column


def test_sparse_decode_sum_refuses_bitmap_messages() -> None:
    dense = threshold_encode(torch.ones(64), torch.zeros(64), 0.5)
    assert dense.format == "bitmap"
    with pytest.raises(EncodingError, match="sparse_decode_sum needs sparse"):
        sparse_decode_sum([dense])


def test_apply_update_at_equals_apply_update() -> None:
    a = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.1), seed=0)
    b = Network(models.mlp(12, 16, 3), updater=optim.SGD(lr=0.1), seed=0)
    indices = torch.tensor([0, 5, 17, a.num_params() - 1])
    values = torch.tensor([1e-3, -2.5, 7e-8, 0.25])
    dense = torch.zeros(a.num_params())
    dense[indices] = values
    a.apply_update(dense)
    b.apply_update_at(indices, values)
    assert _bits(a.params()) == _bits(b.params())


@pytest.mark.parametrize(
    "kinds",
    [
        ("sparse", "sparse", "sparse"),
        ("sparse", "bitmap", "inactive"),
        ("empty", "sparse", "inactive"),
        ("empty", "inactive", "empty"),
    ],
)
def test_exchange_sparse_applies_exactly_what_the_dense_exchange_applies(kinds: tuple[str, ...]) -> None:
    length = 4_000
    sparse = _messages(length)
    payloads = []
    for rank, kind in enumerate(kinds):
        if kind == "inactive":
            payloads.append(b"\x00")
        elif kind == "empty":
            payloads.append(b"\x01" + to_bytes(threshold_encode(torch.zeros(length), torch.zeros(length), 1.0)))
        elif kind == "bitmap":
            payloads.append(b"\x01" + to_bytes(threshold_encode(torch.ones(length), torch.zeros(length), 0.5)))
        else:
            payloads.append(b"\x01" + to_bytes(sparse[rank]))
    group = ThreadGroup(len(kinds))
    start = Network(models.mlp(50, 70, 10), updater=optim.SGD(lr=0.1), seed=0).params()[:length]
    for exchange_fn in (dense_exchange, sparse_exchange):
        results = [None] * len(kinds)

        def run(rank: int, fn=exchange_fn, out=results) -> None:
            out[rank] = fn(group.communicator(rank), payloads[rank], length, "cpu")

        threads = [threading.Thread(target=run, args=(r,)) for r in range(len(kinds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        if exchange_fn is dense_exchange:
            dense = results
        else:
            fused = results
    for d, f in zip(dense, fused):
        assert d.active == f.active == sum(k != "inactive" for k in kinds)
        a, b = _Flat(start), _Flat(start)
        _apply(a, d)
        _apply(b, f)
        assert _bits(a.flat) == _bits(b.flat)
    if "bitmap" not in kinds and "sparse" in kinds:
        assert fused[0].indices is not None  # the sparse representation was used


class _Flat:
    """The two methods of Network that ``_apply`` calls, on a plain tensor."""

    def __init__(self, start: torch.Tensor) -> None:
        self.flat = start.clone()

    def apply_update(self, update: torch.Tensor) -> None:
        self.flat -= update

    def apply_update_at(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        self.flat[indices] = self.flat[indices] - values


def test_step_into_residual_equals_compute_update_then_encode() -> None:
    """The snapshot path (taken where the updater cannot step into the residual: here weight decay, which reads the
    parameters) is bit-identical to compute_update + encode."""
    data = datasets.synthetic_classification(64, 12, 3, seed=0).split(8)
    config = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3))
    nets = [Network(models.mlp(12, 16, 3), updater=optim.Adam(lr=1e-2), seed=0, weight_decay=1e-4) for _ in range(2)]
    states = [SharingState(EncoderState.create(config, nets[0].num_params())) for _ in range(2)]
    assert can_fuse(states[1], nets[1]) and not can_step_into(nets[1])
    for step, batch in enumerate(data):
        update = nets[0].compute_update(batch)
        want, states[0].encoder = encode_step(update, states[0].encoder, step)
        update_norm, param_norm = step_into_residual(states[1], nets[1], batch, False)
        got, states[1].encoder = encode_step(None, states[1].encoder, step)
        assert to_bytes(got) == to_bytes(want)
        assert update_norm == pytest.approx(float(update.norm()), rel=1e-5)
        assert param_norm == pytest.approx(float(nets[0].params_view().norm()), rel=1e-5)
        for net, message in zip(nets, (want, got)):
            net.apply_update(decode_sum([message], torch.zeros(net.num_params())))
        assert _bits(nets[0].params()) == _bits(nets[1].params())
        assert _bits(states[0].encoder.residual) == _bits(states[1].encoder.residual)
        assert _bits(nets[0].updater_state()) == _bits(nets[1].updater_state())


def test_a_calibrating_encoder_takes_the_unfused_path() -> None:
    config = EncoderConfig(threshold_policy=AdaptiveThreshold())  # calibrated start: calibrates from an update
    net = Network(models.mlp(12, 16, 3), updater=optim.Adam(lr=1e-2), seed=0)
    state = SharingState(EncoderState.create(config, net.num_params()))
    assert not can_fuse(state, net)


def test_step_straight_into_the_residual_adds_the_update_and_keeps_the_parameters() -> None:
    """The default path (torchspark's updaters, no weight decay): the updater's step lands in the residual, the
    parameters stay, the updater state advances exactly as compute_update's; the residual equals compute_update's
    update added in, up to the rounding of (p - (p - u)), and the returned norms are the residual's and the
    parameters'."""
    data = datasets.synthetic_classification(64, 12, 3, seed=0).split(8)
    config = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3))
    ref = Network(models.mlp(12, 16, 3), updater=optim.Adam(lr=1e-2), seed=0)
    net = Network(models.mlp(12, 16, 3), updater=optim.Adam(lr=1e-2), seed=0)
    state = SharingState(EncoderState.create(config, net.num_params()))
    assert can_step_into(net)
    for batch in data:
        before = _bits(net.params())
        residual = state.encoder.residual.clone()
        update = ref.compute_update(batch)
        update_norm, param_norm = step_into_residual(state, net, batch, False)
        assert _bits(net.params()) == before  # the parameters did not move
        torch.testing.assert_close(state.encoder.residual, residual + update, rtol=0, atol=1e-6)
        assert update.abs().max() > 1e-4  # a real step was compared
        assert update_norm == pytest.approx(float(state.encoder.residual.norm()), rel=1e-5)
        assert param_norm == pytest.approx(float(net.params_view().norm()), rel=1e-5)
        assert _bits(net.updater_state()) == _bits(ref.updater_state())
        assert net.iteration == ref.iteration


def test_direct_path_refreshes_the_parameter_norm_every_param_norm_every_steps() -> None:
    """The divergence check's parameter norm is recomputed on steps 0, K, 2K, ... (K = PARAM_NORM_EVERY) and reused
    in between; a non-finite cached norm is never reused."""
    data = datasets.synthetic_classification(8, 12, 3, seed=0).split(8)
    config = EncoderConfig(threshold_policy=AdaptiveThreshold(initial=1e-3))
    net = Network(models.mlp(12, 16, 3), updater=optim.Adam(lr=1e-2), seed=0)
    state = SharingState(EncoderState.create(config, net.num_params()))
    first = step_into_residual(state, net, data[0], False)[1]
    assert first == pytest.approx(float(net.params_view().norm()), rel=1e-5)
    with torch.no_grad():
        net.params_view().mul_(2.0)  # the parameters move (as applied messages would move them)
    for step in range(1, PARAM_NORM_EVERY):
        state.steps = step
        assert step_into_residual(state, net, data[0], False)[1] == first  # reused
    state.steps = PARAM_NORM_EVERY
    assert step_into_residual(state, net, data[0], False)[1] == pytest.approx(2 * first, rel=1e-5)  # refreshed
    state.steps, state.param_norm = PARAM_NORM_EVERY + 1, float("nan")
    assert step_into_residual(state, net, data[0], False)[1] == pytest.approx(2 * first, rel=1e-5)


def test_the_sparse_round_equals_the_parsed_round_and_refuses_what_it_refuses() -> None:
    """The per-step decoding reads sparse entries in place (no message objects): same indices and sums as parsing
    every message, bitmaps left to the general path, and the same errors."""
    import struct as _struct

    n = 5000
    g = torch.Generator().manual_seed(3)
    payloads = []
    for t in (1.0, 1.2, 1.0):  # overlapping indices, different thresholds
        payloads.append(b"\x01" + to_bytes(threshold_encode(torch.randn(n, generator=g) * 0.4, torch.zeros(n), t)))
    empty = b"\x01" + to_bytes(threshold_encode(torch.zeros(n), torch.zeros(n), 1.0))
    gathered = [payloads[0], b"\x00", payloads[1], empty, payloads[2]]
    fast = rounds.sparse_round(gathered, n)
    active, messages = rounds.parse_gathered(gathered, n)
    slow = rounds.dense_sum(messages, n, "cpu")
    assert fast is not None and fast.active == active == 4 and len(messages) == 4
    assert [m.format for m in messages] == ["sparse", "sparse", "empty", "sparse"]
    assert len(set(fast.indices.tolist())) < sum(m.num_entries for m in messages)  # some indices overlap
    dense = torch.zeros(n)
    dense[fast.indices] = fast.total
    assert torch.equal(dense, slow)  # bit-identical sums at the union of the indices, zero elsewhere
    assert rounds.round_from_gathered(gathered, n, "cpu").total.equal(fast.total)
    bitmap = b"\x01" + to_bytes(threshold_encode(torch.randn(n, generator=g), torch.zeros(n), 1e-3))
    assert rounds.sparse_round([payloads[0], bitmap], n) is None
    assert rounds.round_from_gathered([payloads[0], bitmap], n, "cpu").indices is None  # the dense decode
    assert rounds.sparse_round([b"\x00", b"\x00"], n).total is None
    with pytest.raises(EncodingError, match="4999 parameters"):
        rounds.sparse_round(gathered, n - 1)
    corrupt = bytearray(payloads[1])
    _struct.pack_into("<i", corrupt, 29, n + 1)
    with pytest.raises(EncodingError, match="indices must be in"):
        rounds.round_from_gathered([payloads[0], bytes(corrupt)], n, "cpu")
    with pytest.raises(EncodingError, match="malformed"):
        rounds.round_from_gathered([b"\x07" + payloads[0][1:]], n, "cpu")


def _images(n: int = 64, seed: int = 0) -> DataSet:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DataSet(x, y)


#: every torchspark updater (all of them can step into a target without weight decay)
ALL_UPDATERS = [
    optim.SGD(lr=0.1),
    optim.SGD(lr=0.05, momentum=0.9),
    optim.SGD(lr=0.05, momentum=0.9, nesterov=True),
    optim.Adam(lr=1e-2),
    optim.AdamW(lr=1e-2),
    optim.RMSprop(lr=1e-3),
    optim.AdaGrad(lr=0.05),
    optim.Adam(lr=1e-2, fused=False),
]


@pytest.mark.parametrize("updater", ALL_UPDATERS, ids=lambda u: repr(u)[:40])
def test_train_step_into_adds_the_update_to_the_target(updater) -> None:
    net = Network(models.mlp(64, 8, 10), updater=updater, seed=0)
    ref = net.copy()
    for batch in _images().split(16):
        start = net.params()
        target = torch.full((net.num_params(),), 0.5)
        update = ref.compute_update(batch)
        loss = train_step_into(net, target, batch)
        assert torch.equal(net.params(), start)
        torch.testing.assert_close(target, 0.5 + update, rtol=0, atol=1e-6)
        assert update.abs().max() > 1e-5
        assert torch.equal(net.updater_state(), ref.updater_state())
        assert loss == ref.last_score and net.iteration == ref.iteration
        for n in (net, ref):  # move both by the same update so the next step starts from equal parameters
            n.apply_update(update)
    assert all(p.data_ptr() != 0 for p in net.module.parameters())
    assert net.params_view().data_ptr() == next(net.module.parameters()).data_ptr()  # still trains through _flat


def test_train_step_into_refuses_what_it_cannot_do() -> None:
    decayed = Network(models.mlp(64, 8, 10), updater=optim.Adam(lr=1e-2), seed=0, weight_decay=1e-4)
    with pytest.raises(ConfigError, match="weight_decay=0"):
        train_step_into(decayed, torch.zeros(decayed.num_params()), _images().slice(0, 8))
    custom = Network(models.mlp(64, 8, 10), updater=lambda ps: torch.optim.SGD(ps, lr=0.1), seed=0)
    assert not can_step_into(custom)
    net = Network(models.mlp(64, 8, 10), updater=optim.Adam(lr=1e-2), seed=0)
    with pytest.raises(ConfigError, match="1-D float32 tensor"):
        train_step_into(net, torch.zeros(3), _images().slice(0, 8))
