"""The gloo mailbox of bounded-staleness sharing between three real processes: a sender thread and one receiver
thread per peer in each process, large and empty payloads, unequal message counts, a collective between epochs."""

from __future__ import annotations

import _mailbox_worker
from _ranks import run_ranks


def test_every_message_arrives_once_in_order_with_its_payload() -> None:
    run_ranks(_mailbox_worker.run, 3, 2, reports=False)
