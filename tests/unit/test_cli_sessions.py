"""``torchspark train``'s session flags (``--parallel``, ``--connect``, ``--remote``, ``--master``) are checked
before anything starts."""

from __future__ import annotations

import pytest

from torchspark.cli import build_parser
from torchspark.cli_checks import check_arguments
from torchspark.errors import ConfigError


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--connect", "--parallel"], "--parallel and --connect pick different ways"),
        (["--connect", "--remote", "sc://127.0.0.1:1"], "--connect and --remote pick different ways"),
        (["--remote", "sc://127.0.0.1:1", "--master", "local[2]"], "drop --master"),
        (["--remote", "127.0.0.1:15002"], "not a Spark Connect URL; use sc://HOST:PORT"),
    ],
)
def test_session_flags_that_do_not_fit_together_are_refused(tmp_path, argv, words) -> None:
    args = build_parser().parse_args(["train", "--output", str(tmp_path / "o"), *argv])
    with pytest.raises(ConfigError, match=words):
        check_arguments(args)
