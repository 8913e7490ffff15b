"""A quiet Spark start: the JVM's stderr is silenced while it launches, unless verbose."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchspark.spark.session import _jvm_stderr_silenced


@pytest.mark.parametrize("quiet", [True, False])
def test_a_process_launched_while_quiet_keeps_a_silent_stderr(quiet: bool, capfd) -> None:
    child = [sys.executable, "-c", "import sys; sys.stderr.write('WARNING: Using incubator modules\\n')"]
    with _jvm_stderr_silenced(quiet):
        subprocess.run(child, check=True)
    print("after", file=sys.stderr, flush=True)  # this process has its own stderr back
    err = capfd.readouterr().err
    assert ("incubator" in err) is not quiet
    assert "after" in err
