"""The namespace cluster fixture: one Spark standalone cluster of two namespace hosts for the whole session.

Runs when this process is root and ``ip netns`` works (CI as root does); otherwise every ``multihost`` test is
skipped with the reason. Torn down at the end of the session, also when a test fails (and at interpreter exit).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))

from cluster_harness import NetnsCluster, unavailable_reason  # noqa: E402


@pytest.fixture(scope="session")
def netns_cluster():
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"multi-host namespace cluster unavailable: {reason}")
    with NetnsCluster(workers=2, cores=1, memory="1g") as cluster:
        yield cluster
