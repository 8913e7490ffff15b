"""The Spark Connect route's payloads without a server: chunked rows, WorkerResult without pickle, inline shipping."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from torchspark.errors import DataError
from torchspark.spark.connect.chunks import from_chunks, gather_payloads, payload_batches, to_chunks
from torchspark.spark.connect.results import decode_result, decode_tree, encode_result, encode_tree
from torchspark.spark.connect.shipping import ship_bytes
from torchspark.training.task import WorkerResult


@pytest.mark.parametrize("size", [0, 1, 9, 10, 11, 1000])
def test_chunks_round_trip(size: int) -> None:
    payload = bytes(range(256)) * 4
    payload = payload[:size]
    parts = to_chunks(payload, 10)
    assert all(len(p) <= 10 for p in parts) and len(parts) == max(1, math.ceil(size / 10))
    assert from_chunks(parts) == payload


def test_payload_rows_are_joined_per_rank_and_kind_in_any_order() -> None:
    blobs = {(0, "result"): b"a" * 25, (1, "result"): b"b" * 7, (1, "error"): b""}
    batches = [b for (rank, kind), blob in blobs.items() for b in payload_batches(rank, kind, blob, 10)]
    table = pa.Table.from_batches(batches[::-1])  # the client may read the parts in any order
    assert gather_payloads(table) == blobs
    assert gather_payloads([tuple(r.values()) for r in table.to_pylist()]) == blobs  # Rows from collect()


def test_a_missing_part_is_an_error() -> None:
    batches = list(payload_batches(0, "result", b"x" * 30, 10))
    with pytest.raises(DataError, match="parts \\[0, 2\\] of 3"):
        gather_payloads(pa.Table.from_batches([batches[0], batches[2]]))


def test_a_worker_result_round_trips_without_pickle() -> None:
    stats = {
        "format": 1,
        "worker": "worker-0",
        "phases": {"names": ["fit"], "code": np.array([0], np.int32), "start": np.array([1.5]), "attrs": {}},
    }
    result = WorkerResult(
        rank=0,
        examples=96,
        iterations=12,
        score=math.nan,
        params=torch.randn(7),
        updater_state=torch.randn(14),
        extra_state={"residual": torch.randn(3)},
        extra_config={"sharing.topology": "all_gather"},
        stats=stats,
        buffers={"bn.running_mean": torch.zeros(2), "bn.num_batches_tracked": torch.tensor(4)},
        threads=1,
        param_checksum="abc",
        network={"address": "127.0.0.1"},
    )
    blob = encode_result(result)
    assert b"pickle" not in blob[:64] and blob[8:9] == b"{"  # a safetensors header
    back = decode_result(blob)
    for name in ("params", "updater_state"):
        assert torch.equal(getattr(back, name), getattr(result, name))
    assert torch.equal(back.extra_state["residual"], result.extra_state["residual"])
    assert back.buffers["bn.num_batches_tracked"].dtype == torch.int64
    assert back.stats["phases"]["code"].dtype == np.int32 and back.stats["phases"]["start"][0] == 1.5
    assert math.isnan(back.score) and back.extra_config == result.extra_config and back.network == result.network


def test_objects_json_cannot_hold_are_refused() -> None:
    assert decode_tree(encode_tree({"a": [1, 2.5, None, "x"]})) == {"a": [1, 2.5, None, "x"]}
    with pytest.raises(DataError, match="without pickle"):
        encode_tree({"a": object()})


def test_small_payloads_travel_in_the_closure() -> None:
    shipment = ship_bytes(None, b"weights", "w", limit=16)  # no session needed: nothing is uploaded
    assert not shipment.via_artifacts and shipment.read() == b"weights"
