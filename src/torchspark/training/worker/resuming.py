"""Where a resumed worker's first epoch continues: the minibatches its checkpoint says are done are skipped only
after they are checked to be the ones trained before the cut (`torchspark.training.checkpoint.position`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from torchspark.data import Batch
from torchspark.training.checkpoint import RestoredRank, check_position
from torchspark.training.checkpoint.position import Position, refusal, verify_prefix

__all__ = ["resume_epoch"]

log = logging.getLogger(__name__)


def resume_epoch(
    restored: RestoredRank, epoch: int, items: Iterable[Any], load: Callable[[Any], Batch], restart: bool
) -> tuple[Iterable[Any], int, Position | None]:
    """The resumed epoch's items after the checkpoint's position, once the position is checked.

    Args:
        restored: the rank's record (``done`` minibatches of epoch ``epoch`` trained before the cut).
        epoch: the fit's epoch it resumes in.
        items: the epoch's items as the rank's source gives them now (a list, or an iterator read once).
        load: turns an item into its minibatch (the fingerprint is of the loaded minibatches).
        restart: the fit's ``restart_epoch``: on a mismatch train the whole epoch instead of refusing.
    Returns:
        ``(items, skipped, start)``: what to train, how many minibatches were skipped (0: the epoch restarts), and
        the position the training stream starts at (None: from the epoch's start).
    Raises:
        ConfigError: the data no longer matches the checkpoint (`refusal` names what changed).
    """
    done = restored.done
    length = len(items) if isinstance(items, (list, tuple)) else None
    if not done:
        return items, 0, None
    if isinstance(items, (list, tuple)):
        prefix: list[Any] | tuple[Any, ...] = items[:done]
        rest: Iterable[Any] = items[done:]
    else:  # read once: keep the skipped items (raw) in case the epoch restarts
        stream = iter(items)
        prefix = list(itertools.islice(stream, done))
        rest = stream
    problem, start = "", None
    if length is not None and (restored.epoch_length not in (None, length) or done > length):
        if not restart:
            check_position(restored, epoch, length)  # raises, naming the counts
        problem = f"the epoch has {length} minibatches now, {restored.epoch_length} then"
    elif restored.position is not None:
        start, problem = verify_prefix(restored.position, prefix, done, load)
        if problem and not restart:
            raise refusal(restored.where, epoch, done, problem)
    if not problem:
        return rest, done, start
    log.warning(
        "%s: %s; restart_epoch=True: this rank trains epoch %d again from its start (%d minibatches of it trained "
        "before the cut are trained again)",
        restored.where,
        problem,
        epoch,
        done,
    )
    return (items if length is not None else itertools.chain(prefix, rest)), 0, None
