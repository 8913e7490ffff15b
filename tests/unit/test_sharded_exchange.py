"""The sharded exchange (reduce-scatter by index shards + all-gather of sums) against the plain all-gather."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from reference_loops import dense_exchange
from torchspark.encoding import EncodedUpdate, decode, from_bytes, threshold_encode, to_bytes
from torchspark.errors import ConfigError, EncodingError, WaitTimeout
from torchspark.training import ThreadGroup
from torchspark.training.algorithms.sharing.settings import SharingSettings
from torchspark.training.algorithms.sharing.sharded import (
    _sum_pieces,
    shard_bounds,
    shard_sum_bytes,
    sharded_exchange,
    split_message,
)
from torchspark.training.algorithms.sharing.topology import resolve_topology
from torchspark.training.comm import SoloCommunicator


def _run(world: int, fn, timeout_s: float = 20.0) -> list:
    """fn(comm) on `world` threads of one ThreadGroup; results by rank (re-raises the first error)."""
    group = ThreadGroup(world, timeout_s=timeout_s)
    results: list = [None] * world
    errors: list = [None] * world

    def target(rank: int) -> None:
        try:
            results[rank] = fn(group.communicator(rank))
        except BaseException as e:  # noqa: BLE001
            errors[rank] = e
            group.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for e in errors:
        if e is not None and not isinstance(e, WaitTimeout):
            raise e
    for e in errors:
        if e is not None:
            raise e
    return results


def _payload(kind: str, length: int, rng: np.random.Generator) -> bytes:
    """One worker's flag-byte payload of the given kind: sparse, bitmap, empty (active, no message), inactive."""
    if kind == "inactive":
        return b"\x00"
    if kind == "empty":
        return b"\x01"
    t = float(rng.uniform(0.5, 2.0))
    density = 0.01 if kind == "sparse" else 0.6
    update = torch.from_numpy((rng.standard_normal(length) * (rng.random(length) < density) * 3 * t).astype(np.float32))
    message = threshold_encode(update, torch.zeros(length), t)
    if message.format != kind:  # tiny lengths: force the format the test asks for
        signed = torch.nonzero(update.abs() >= t, as_tuple=True)[0].to(torch.int32) + 1
        signed = torch.where(update[signed.long() - 1] > 0, signed, -signed)
        if kind == "sparse":
            message = EncodedUpdate("sparse", length, t, signed, signed.numel())
        else:
            from torchspark.encoding._kernels import sparse_to_bitmap

            message = EncodedUpdate("bitmap", length, t, sparse_to_bitmap(signed, length), signed.numel())
    return b"\x01" + to_bytes(message)


def _bits(t: torch.Tensor | None) -> bytes | None:
    return None if t is None else t.numpy().tobytes()


def _applied(result, length: int) -> bytes:
    """The parameters after the training loop's ``_apply`` of ``result`` to a fixed start (the exchanges'
    contract: the same parameters, whether the sum comes dense or as values at ascending indices)."""
    params = torch.linspace(-1.0, 1.0, length)
    if result.total is not None:
        if result.indices is not None:
            assert bool((result.indices[1:] > result.indices[:-1]).all())  # ascending, unique
            params[result.indices] -= result.total
        else:
            params -= result.total
    return params.numpy().tobytes()


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("length", [1, 7, 64, 1001])
def test_sharded_is_bit_identical_to_all_gather(world: int, length: int) -> None:
    rng = np.random.default_rng(world * 1000 + length)
    kinds = ["sparse", "bitmap", "empty", "inactive"]
    for trial in range(12):
        mix = [kinds[(trial + r * (trial // 4 + 1)) % 4] for r in range(world)]
        payloads = [_payload(k, length, rng) for k in mix]
        plain = _run(world, lambda c, payloads=payloads: dense_exchange(c, payloads[c.rank], length, "cpu"))
        sharded = _run(world, lambda c, payloads=payloads: sharded_exchange(c, payloads[c.rank], length, "cpu"))
        for p, s in zip(plain, sharded):
            assert s.active == p.active == sum(k != "inactive" for k in mix)
            assert _applied(s, length) == _applied(p, length), (mix, length)
            assert (s.total is None) == all(k in ("empty", "inactive") for k in mix)


def test_sharded_sums_collide_exactly() -> None:
    """Many overlapping messages with different thresholds: the float32 sums depend on the order of the additions,
    and the sharded route must make the same ones (rank order) as the plain one."""
    length, world = 257, 5
    rng = np.random.default_rng(7)
    payloads = []
    for r in range(world):
        t = float(np.float32(0.1 * (r + 1) / 3))
        signed = torch.arange(1, length + 1, dtype=torch.int32)[torch.from_numpy(rng.random(length) < 0.9)]
        signed = torch.where(torch.from_numpy(rng.random(signed.numel()) < 0.5), signed, -signed)
        payloads.append(b"\x01" + to_bytes(EncodedUpdate("sparse", length, t, signed, signed.numel())))
    plain = _run(world, lambda c: dense_exchange(c, payloads[c.rank], length, "cpu"))
    sharded = _run(world, lambda c: sharded_exchange(c, payloads[c.rank], length, "cpu"))
    reversed_sum = torch.zeros(length)
    for data in reversed(payloads):
        decode(from_bytes(data[1:]), reversed_sum)
    assert not torch.equal(reversed_sum, plain[0].total)  # the order matters for these values ...
    assert all(_applied(s, length) == _applied(plain[0], length) for s in sharded)  # ... and sharding keeps it
    assert all(s.indices is None for s in sharded)  # 90% density: the shard sums travel (and apply) dense


def test_sparse_shard_sums_apply_at_their_indices_only() -> None:
    """Sparse messages: every rank gets S_t as values at the union of the sent indices (no parameter-sized buffer),
    the same parameters after applying as the plain exchange's dense sum."""
    length, world = 1000, 3
    payloads = []
    for r in range(world):
        signed = torch.tensor([1 + 7 * r, 500, 999 - r], dtype=torch.int32) * (1 if r % 2 else -1)
        payloads.append(b"\x01" + to_bytes(EncodedUpdate("sparse", length, 0.25, signed, 3)))
    plain = _run(world, lambda c: dense_exchange(c, payloads[c.rank], length, "cpu"))
    sharded = _run(world, lambda c: sharded_exchange(c, payloads[c.rank], length, "cpu"))
    nonzero = torch.nonzero(plain[0].total.view(torch.int32)).squeeze(1)  # where the dense sum is not +0.0
    assert 3 <= nonzero.numel() < 10
    for s in sharded:
        assert s.indices is not None and torch.equal(s.indices, nonzero)
        assert _applied(s, length) == _applied(plain[0], length)


@pytest.mark.parametrize("bad", [b"\x02", b"\x00junk", b"\x01TSEUgarbage"])
def test_malformed_payload_raises_on_every_rank(bad: bytes) -> None:
    length = 40
    good = _payload("sparse", length, np.random.default_rng(0))
    payloads = [good, bad, good]
    outcomes = _run(3, lambda c: _catch(lambda: sharded_exchange(c, payloads[c.rank], length, "cpu")))
    assert all(isinstance(o, EncodingError) and "worker 1" in str(o) for o in outcomes), outcomes


def test_length_mismatch_raises_on_every_rank() -> None:
    good = _payload("bitmap", 40, np.random.default_rng(1))
    other = _payload("sparse", 41, np.random.default_rng(2))
    outcomes = _run(2, lambda c: _catch(lambda: sharded_exchange(c, [good, other][c.rank], 40, "cpu")))
    # rank 1 itself has a 41-element message for a 40-parameter network; everyone names it
    assert all(isinstance(o, EncodingError) and "worker 1" in str(o) for o in outcomes), outcomes


def _catch(fn):
    try:
        return fn()
    except EncodingError as e:
        return e


@pytest.mark.parametrize("length,parts", [(10, 3), (0, 2), (3, 5), (5, 5), (1001, 7), (16, 4), (17, 1)])
def test_shard_bounds_cover_the_range(length: int, parts: int) -> None:
    bounds = shard_bounds(length, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous
    assert all(lo <= hi for lo, hi in bounds)
    assert all(lo % 4 == 0 or lo == length for lo, _ in bounds)  # bitmap pieces are whole bytes
    if parts > length:
        assert any(lo == hi for lo, hi in bounds)  # empty shards exist and are handled


@pytest.mark.parametrize("kind", ["sparse", "bitmap"])
@pytest.mark.parametrize("length,parts", [(10, 3), (3, 5), (1001, 7), (9, 2)])
def test_split_pieces_decode_to_the_message(kind: str, length: int, parts: int) -> None:
    """Cutting and re-assembling a message per shard, by hand: the pieces hold exactly the message's steps."""
    data = _payload(kind, length, np.random.default_rng(length * parts))
    message = from_bytes(data[1:])
    bounds = shard_bounds(length, parts)
    pieces = split_message(message, bounds)
    assert len(pieces) == parts
    whole = decode(message, torch.zeros(length))
    # route the pieces through the exchange's own owner logic, one shard at a time
    rebuilt = torch.zeros(length)
    for (lo, hi), piece in zip(bounds, pieces):
        active, any_message, shard = _sum_pieces([piece], length, lo, hi, "cpu")
        assert active == 1 and any_message
        if shard is not None:
            rebuilt[lo:hi] = shard
        else:
            assert not whole[lo:hi].any()
    assert torch.equal(rebuilt, whole)


def test_shard_sum_bytes_is_lossless_and_compact() -> None:
    dense = torch.tensor([1.0, -2.5, 3e-38, 7.0])
    assert shard_sum_bytes(dense, 4)[:1] == b"D"
    sparse = torch.zeros(100)
    sparse[[3, 50]] = torch.tensor([1e-30, -4.0])
    out = shard_sum_bytes(sparse, 100)
    assert out[:1] == b"S" and len(out) == 1 + 2 * 8
    assert shard_sum_bytes(None, 5) == b"S"


def test_solo_and_thread_all_to_all_bytes() -> None:
    assert SoloCommunicator().all_to_all_bytes([b"x"]) == [b"x"]
    got = _run(3, lambda c: c.all_to_all_bytes([f"{c.rank}->{j}".encode() * j for j in range(3)]))
    for me, row in enumerate(got):
        assert row == [f"{src}->{me}".encode() * me for src in range(3)]
    with pytest.raises(ValueError, match="one payload per rank"):
        SoloCommunicator().all_to_all_bytes([b"a", b"b"])


def test_resolve_topology() -> None:
    assert resolve_topology("auto", 2, 3) == "sharded"
    assert resolve_topology("auto", 2, 2) == "all_gather"
    assert resolve_topology("all_gather", 1, 100) == "all_gather"
    assert resolve_topology("sharded", 16, 1) == "sharded"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"topology": "tree"}, "topology must be one of"),
        ({"topology": None}, "topology must be one of"),
        ({"shard_above_workers": 0}, "shard_above_workers must be an integer >= 1"),
        ({"shard_above_workers": True}, "shard_above_workers"),
        ({"shard_above_workers": 2.5}, "shard_above_workers"),
    ],
)
def test_sharing_settings_reject_bad_topology(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SharingSettings(**kwargs)


def test_sharing_settings_round_trip_topology() -> None:
    s = SharingSettings(topology="sharded", shard_above_workers=4)
    back = SharingSettings.from_dict(s.to_dict())
    assert (back.topology, back.shard_above_workers) == ("sharded", 4)
    assert SharingSettings.from_dict({}).topology == "auto"


def test_sharded_topology_refuses_the_asynchronous_mode() -> None:
    with pytest.raises(ConfigError, match="topology='sharded'"):
        SharingSettings(topology="sharded", max_staleness=1)
    assert SharingSettings(topology="auto", max_staleness=1).topology == "auto"


class _CorruptShardSumsFor:
    """A communicator that corrupts, for one rank only, the shard sum rank 0 sends it (as a bad link or memory would
    between the all-gather and the decode): only that rank can see it."""

    def __init__(self, comm, victim: int) -> None:
        self._comm, self._victim = comm, victim
        self.rank, self.world_size = comm.rank, comm.world_size

    def all_to_all_bytes(self, payloads: list[bytes]) -> list[bytes]:
        return self._comm.all_to_all_bytes(payloads)

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        got = self._comm.all_gather_bytes(payload)
        if self.rank == self._victim:
            got[0] = b"S" + b"\xff" * 8  # one index far outside rank 0's shard
        return got


def test_a_shard_sum_corrupt_on_one_rank_is_an_encoding_error_on_every_rank() -> None:
    """Rank 2 alone sees rank 0's shard sum corrupt: every rank raises EncodingError naming rank 2 and the shard at
    the next exchange (the loop always runs one more), none waits for rank 2 until its timeout (WaitTimeout)."""
    length, world = 400, 3
    payloads = [_payload("sparse", length, np.random.default_rng(r)) for r in range(world)]

    def two_steps(comm) -> object:
        comm = _CorruptShardSumsFor(comm, victim=2)
        sharded_exchange(comm, payloads[comm.rank], length, "cpu")
        return sharded_exchange(comm, b"\x00", length, "cpu")  # the next step (the epoch's last, all inactive)

    outcomes = _run(world, lambda c: _catch(lambda: two_steps(c)), timeout_s=20.0)
    for outcome in outcomes:
        assert isinstance(outcome, EncodingError), outcomes
        assert "worker 2 received a corrupt shard sum" in str(outcome) and "elements [0, 136)" in str(outcome)
