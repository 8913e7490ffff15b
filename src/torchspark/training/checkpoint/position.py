"""A rank's data position inside an epoch, recorded so that a resume cannot lie about it.

A checkpoint cut inside an epoch says "this rank has trained the first ``done`` minibatches of epoch ``e``"; a resume
skips the first ``done`` minibatches of that epoch's data *as the resumed fit gives it*. That is only right when
they are the same examples: another batch size, more or fewer examples, or the same examples in another order would
make the resume skip examples never trained and train others twice. So each cut also records a fingerprint of what
was trained (`Position`), and the resume checks the minibatches it is about to skip against it
(`verify_prefix`) before training anything:

* ``first_batch``: the examples of the epoch's first minibatch (the batch size, as the data gives it);
* ``examples``: the examples of the ``done`` minibatches trained before the cut;
* ``digest``: a rolling hash over those minibatches, each by its size and the bytes of its first and last
  example (every array: features, labels, masks), so another order or other data changes it;
* ``epoch_length`` (kept on the rank record beside it, when the rank's source knew it up front): the epoch's
  minibatches, so a change after the cut (data appended or removed at the end) is caught too.

The fingerprint is taken of the *loaded* minibatches, the same on every route (in-memory batches, serialized
batches, batch files, slices of exported files, per-epoch plans, queues), so a resume from a new driver process,
whose export files have other names, still matches. Checking costs one read of the skipped minibatches, once per
resume. A mismatch raises [`ConfigError`][torchspark._io.ConfigError] naming what changed, unless the fit was asked to
``restart_epoch``: then the rank trains the interrupted epoch again from its start.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torchspark.data import Batch, MultiDataSet
from torchspark.errors import ConfigError

__all__ = ["Position", "PositionTap", "batch_key", "verify_prefix", "position_mismatch", "refusal"]

_EMPTY = hashlib.blake2b(b"torchspark.position/1", digest_size=16).hexdigest()


def _arrays(batch: Batch) -> list[torch.Tensor | None]:
    """Every array of a minibatch in a fixed order (absent ones as None)."""
    if isinstance(batch, MultiDataSet):
        groups = (batch.features, batch.labels, batch.features_masks, batch.labels_masks)
        return [t for group in groups for t in ([None] if group is None else group)]
    return [batch.features, batch.labels, batch.features_mask, batch.labels_mask]


def batch_key(batch: Batch) -> bytes:
    """What identifies one minibatch cheaply: its size and its first and last example (every array: dtype, shape and
    bytes)."""
    n = len(batch)
    parts = [str(n).encode()]
    for tensor in _arrays(batch):
        if tensor is None:
            parts.append(b"-")
            continue
        parts.append(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        if n:
            ends = torch.stack([tensor[0], tensor[n - 1]]).detach().cpu().contiguous()
            parts.append(ends.view(-1).view(torch.uint8).numpy().tobytes())
    return b"|".join(parts)


def _chain(digest: str, key: bytes) -> str:
    return hashlib.blake2b(bytes.fromhex(digest) + key, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Position:
    """The fingerprint of the first ``minibatches`` minibatches of a rank's epoch (the module docstring)."""

    minibatches: int = 0
    examples: int = 0
    first_batch: int | None = None
    digest: str = _EMPTY

    def to_json(self) -> dict[str, Any]:
        return {
            "minibatches": self.minibatches,
            "examples": self.examples,
            "first_batch": self.first_batch,
            "digest": self.digest,
        }

    @classmethod
    def from_json(cls, record: Any) -> Position | None:
        """The record a rank file holds (None: none, from an older version or an elastic re-sharding, or not one)."""
        if not isinstance(record, dict):
            return None
        try:
            minibatches, examples, first = record["minibatches"], record["examples"], record["first_batch"]
            digest = str(record["digest"])
            bytes.fromhex(digest)
        except (KeyError, ValueError, TypeError):
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (minibatches, examples)):
            return None
        if first is not None and (not isinstance(first, int) or isinstance(first, bool)):
            return None
        return cls(minibatches, examples, first, digest)

    def then(self, batch: Batch) -> Position:
        """This position one minibatch further."""
        n = len(batch)
        return Position(
            self.minibatches + 1,
            self.examples + n,
            n if self.first_batch is None else self.first_batch,
            _chain(self.digest, batch_key(batch)),
        )


class PositionTap:
    """Fingerprints one epoch's minibatches as they pass to training; `at` gives the position after any
    number of them (the cut may come while the loader has read ahead).

    Args:
        start: the position the epoch's stream starts at (a resumed epoch: the verified position of the skipped
            minibatches).
    """

    def __init__(self, start: Position | None = None) -> None:
        self._start = start or Position()
        self._after: list[Position] = []

    def __call__(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        current = self._start
        for batch in batches:
            current = current.then(batch)
            self._after.append(current)
            yield batch

    @property
    def seen(self) -> int:
        """Minibatches of the epoch passed so far (those before ``start`` included)."""
        return self._start.minibatches + len(self._after)

    def at(self, done: int) -> Position:
        """The position after the epoch's first ``done`` minibatches (at most as many as have passed)."""
        seen = done - self._start.minibatches
        if seen <= 0 or not self._after:
            return self._start
        return self._after[min(seen, len(self._after)) - 1]


def position_mismatch(saved: Position, now: Position, done: int, complete: bool) -> str:
    """What changed between the position a checkpoint recorded and the one the resumed data gives (``""``: nothing).

    Args:
        saved: the checkpoint's record.
        now: the same number of minibatches of the resumed data (fewer when it has fewer: ``complete`` False).
        done: the minibatches the checkpoint says were trained.
        complete: whether the resumed data had ``done`` minibatches at all.
    """
    if not complete:
        return (
            f"the epoch now has only {now.minibatches} minibatches for this rank, fewer than the {done} trained "
            "before the cut (the data got smaller or the batch size larger)"
        )
    if saved.first_batch != now.first_batch:
        return (
            f"the batch size or the data size changed: the epoch's first minibatch had {saved.first_batch} examples "
            f"then and has {now.first_batch} now"
        )
    if saved.examples != now.examples:
        return (
            f"the data size or its split changed: the {done} minibatches before the cut held {saved.examples} "
            f"examples then and {now.examples} now"
        )
    if saved.digest != now.digest:
        return (
            f"the data order or content changed: the {done} minibatches before the cut are not the same examples "
            "in the same order as then"
        )
    return ""


def verify_prefix(
    saved: Position, items: Iterable[Any], done: int, load: Callable[[Any], Batch]
) -> tuple[Position, str]:
    """Fingerprint the first ``done`` of ``items`` (loading each; from an iterator exactly ``done`` are taken) and
    compare with ``saved``.

    Returns:
        ``(position, problem)``: the position after the items read, and `position_mismatch`'s words.
    """
    now = Position()
    for item in itertools.islice(items, done):
        now = now.then(load(item))
    if saved.minibatches != done:
        return now, (
            f"its record fingerprints {saved.minibatches} minibatches, not the {done} it says are done (the file is "
            "damaged)"
        )
    return now, position_mismatch(saved, now, done, now.minibatches == done)


def refusal(where: str, epoch: int, done: int, problem: str) -> ConfigError:
    """The error of a resume whose data no longer matches its checkpoint's position."""
    return ConfigError(
        f"{where}: the checkpoint was cut after {done} minibatches of epoch {epoch} of this rank's data, but "
        f"{problem}; resuming would skip examples never trained and train others twice. Resume with the same "
        "data, batch size, order and number of workers; or pass restart_epoch=True to fit to train that epoch "
        "again from its start on the new data (the examples it trained before the cut are trained twice); or "
        "use a new run_id to start a new run"
    )
