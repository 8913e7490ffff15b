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
    for r in (reports[0], reports[2]):
        assert "worker 1 failed during epoch 0" in r["error"], r
