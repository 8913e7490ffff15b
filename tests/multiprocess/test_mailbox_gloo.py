"""The gloo mailbox of bounded-staleness sharing between three real processes: a sender thread and one receiver
thread per peer in each process, large and empty payloads, unequal message counts, a collective between epochs."""

from __future__ import annotations

import _mailbox_worker
from _ranks import run_ranks


def test_every_message_arrives_once_in_order_with_its_payload() -> None:
    run_ranks(_mailbox_worker.run, 3, 2, reports=False)


def test_after_an_error_every_receiver_thread_ends_before_the_group_is_destroyed() -> None:
    """A gloo receive cannot be cancelled: the failing rank's ABORT marker ends its peers' receivers for it, and
    theirs end its own, so no thread stays blocked in ``recv`` after a failed epoch."""
    reports = run_ranks(_mailbox_worker.run_failing, 3, check_exit=True)
    assert all(r["receivers_alive"] == [] for r in reports), reports
    # ranks 0 and 2 each fail on the first ABORT they read: rank 1's, or the other's (sent after it failed in turn);
    # the first of them to fail can only have read rank 1's
    named = {
        r["rank"]: [w for w in range(3) if f"worker {w} failed during epoch 0" in r["error"]] for r in reports[::2]
    }
    assert all(len(ws) == 1 and ws[0] != rank for rank, ws in named.items()), reports
    assert [1] in named.values(), reports
