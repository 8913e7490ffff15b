"""Wire format of encoded updates: round trip and refusal of foreign, truncated or corrupt bytes."""

from __future__ import annotations

import struct

import pytest
import torch

from torchspark.encoding import decode, from_bytes, threshold_encode, to_bytes
from torchspark.encoding.wire import MAGIC, VERSION
from torchspark.errors import EncodingError


def _message(fmt: str) -> bytes:
    n = 103
    update = torch.zeros(n)
    if fmt == "sparse":
        update[[0, 5, 102]] = torch.tensor([2.0, -2.0, 2.0])
    elif fmt == "bitmap":
        update = torch.linspace(-3, 3, n)
    msg = threshold_encode(update, torch.zeros(n), 1.0)
    assert msg.format == fmt
    return to_bytes(msg)


@pytest.mark.parametrize("fmt", ["sparse", "bitmap", "empty"])
def test_round_trip_preserves_everything(fmt: str) -> None:
    data = _message(fmt)
    msg = from_bytes(data)
    assert msg.format == fmt and msg.length == 103 and msg.threshold == 1.0
    assert to_bytes(msg) == data
    assert from_bytes(bytearray(data)).payload.equal(msg.payload)


def test_header_layout() -> None:
    data = _message("sparse")
    assert data[:4] == MAGIC and data[4] == VERSION and data[5] == 1
    assert struct.unpack_from("<QQf", data, 8) == (103, 3, 1.0)
    assert struct.unpack_from("<3i", data, 28) == (1, -6, 103)


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_are_rejected(seed: int) -> None:
    junk = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    with pytest.raises(EncodingError, match="magic"):
        from_bytes(junk.numpy().tobytes())


@pytest.mark.parametrize("fmt", ["sparse", "bitmap", "empty"])
def test_every_truncation_is_rejected(fmt: str) -> None:
    data = _message(fmt)
    for cut in range(len(data)):
        with pytest.raises(EncodingError, match=r"truncated.*(expected .* got|got)"):
            from_bytes(data[:cut])


def test_over_long_is_rejected() -> None:
    with pytest.raises(EncodingError, match="over-long.*expected 40 bytes, got 41"):
        from_bytes(_message("sparse") + b"\0")


def test_bad_magic_and_version_and_format() -> None:
    data = bytearray(_message("sparse"))
    with pytest.raises(EncodingError, match="bad magic"):
        from_bytes(b"NOPE" + bytes(data[4:]))
    bad_version = bytes(data[:4]) + bytes([VERSION + 1]) + bytes(data[5:])
    with pytest.raises(EncodingError, match=f"version {VERSION + 1}"):
        from_bytes(bad_version)
    bad_format = bytes(data[:5]) + bytes([9]) + bytes(data[6:])
    with pytest.raises(EncodingError, match="format byte 9"):
        from_bytes(bad_format)


def test_corrupt_payloads_are_rejected() -> None:
    data = bytearray(_message("sparse"))
    struct.pack_into("<i", data, 28, 104)  # index beyond length 103
    with pytest.raises(EncodingError, match="indices"):
        from_bytes(bytes(data))
    struct.pack_into("<i", data, 28, 0)  # index 0 is not a valid 1-based index
    with pytest.raises(EncodingError, match="indices"):
        from_bytes(bytes(data))
    bitmap = bytearray(_message("bitmap"))
    bitmap[30] = 0b11  # code 3: value and sign bit both set
    with pytest.raises(EncodingError, match="code 3"):
        from_bytes(bytes(bitmap))
    bad_threshold = bytearray(_message("empty"))
    struct.pack_into("<f", bad_threshold, 24, -1.0)
    with pytest.raises(EncodingError, match="threshold"):
        from_bytes(bytes(bad_threshold))


def test_decoded_from_bytes_equals_decoded_from_message() -> None:
    for fmt in ("sparse", "bitmap"):
        data = _message(fmt)
        a = decode(from_bytes(data), torch.zeros(103))
        assert a.abs().sum() > 0
        assert a.equal(decode(from_bytes(to_bytes(from_bytes(data))), torch.zeros(103)))


def _sparse_corruptions() -> list[tuple[bytes, str]]:
    """(bytes, error pattern) of corrupt sparse messages: every check of the sparse payload, and header ones."""
    base = _message("sparse")
    out = []
    for index, value, pattern in (
        (0, 104, r"in \[1, 103\] in magnitude, got range \[6, 104\]"),
        (0, 0, r"range \[0, 103\]"),
        (0, -(2**31), r"range \[6, 2147483648\]"),  # abs overflows int32: still refused
        (1, 1, "strictly ascending"),  # |1|, |1|: a repeated index
        (2, 3, "strictly ascending"),  # 1, 6, 3
        (1, 200, r"range \[1, 200\]"),
    ):  # out of range and out of order: range first
        data = bytearray(base)
        struct.pack_into("<i", data, 28 + 4 * index, value)
        out.append((bytes(data), pattern))
    out.append((base[:-1], "truncated"))
    out.append((b"NOPE" + base[4:], "bad magic"))
    return out


@pytest.mark.parametrize("case", range(8))
def test_sparse_view_checks_like_from_bytes(case: int) -> None:
    from torchspark.encoding.wire import sparse_view

    data, pattern = _sparse_corruptions()[case]
    with pytest.raises(EncodingError, match=pattern):
        from_bytes(data)
    with pytest.raises(EncodingError, match=pattern):
        sparse_view(data)


def test_sparse_view_reads_entries_in_place() -> None:
    from torchspark.encoding.wire import sparse_view

    data = _message("sparse")
    length, threshold, entries = sparse_view(data)
    assert (length, threshold) == (103, 1.0)
    assert entries.tolist() == from_bytes(data).payload.tolist() == [1, -6, 103]
    assert sparse_view(_message("empty"))[2].shape == (0,)
    assert sparse_view(_message("bitmap")) is None  # the caller decodes bitmaps with from_bytes
