"""Spark Connect: telling a Connect session from a classic one, and a local Connect server for one machine.

A Connect session (``SparkSession.builder.remote("sc://host:15002")``, ``spark.api.mode=connect``) has no
``SparkContext``, no RDDs and no broadcast; its client may run outside the cluster's network.
"""

from torchspark.spark.connect.server import ConnectServer, start_connect_server
from torchspark.spark.session_kinds import is_connect_session, require_classic, session_kind

__all__ = ["ConnectServer", "start_connect_server", "is_connect_session", "require_classic", "session_kind"]
