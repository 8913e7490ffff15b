"""The CLI checks outputs and the master before it works: exit 2 with one line naming the option and the fix.

Each case in :data:`CASES` is ``(id, argv, message fragment)`` (the error class is ConfigError, printed as
``torchspark: error: ...``): reusable by the bad-input catalogue. The commands themselves are replaced by a recorder,
so a case passes only when the check refused the arguments before the command started.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from torchspark import cli
from torchspark.cli_checks import check_arguments, check_master
from torchspark.errors import ConfigError


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, never listening: connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def where(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "out" / "model").mkdir(parents=True)
    (tmp_path / "out" / "model" / "notes.txt").write_text("mine")
    (tmp_path / "model").mkdir()  # a --model directory (never loaded: the checks come first)
    (tmp_path / "data.parquet").mkdir()
    return {"tmp": str(tmp_path), "port": str(_closed_port())}


# (id, argv with {tmp} and {port} placeholders, fragment of the one-line message)
CASES: list[tuple[str, list[str], str]] = [
    ("train output under /proc", ["train", "--output", "/proc/torchspark-out"], "cannot write in '/proc'"),
    ("train output is a file", ["train", "--output", "{tmp}/a-file"], "is a file, not a directory"),
    (
        "train output below a file",
        ["train", "--output", "{tmp}/a-file/sub"],
        "is a file, so the path cannot be created",
    ),
    (
        "train output model dir holds other files",
        ["train", "--output", "{tmp}/out"],
        "holds files that are not part of a saved network (['notes.txt'])",
    ),
    (
        "evaluate output is a directory",
        ["evaluate", "--model", "{tmp}/model", "--output", "{tmp}"],
        "is a directory; pass a file path",
    ),
    (
        "evaluate output under /proc",
        ["evaluate", "--model", "{tmp}/model", "--output", "/proc/x/eval.json"],
        "cannot write in '/proc'",
    ),
    (
        "predict output is the input",
        ["predict", "--model", "{tmp}/model", "--data", "{tmp}/data.parquet", "--output", "{tmp}/data.parquet"],
        "is --data '{tmp}/data.parquet'",
    ),
    (
        "predict output is a file",
        ["predict", "--model", "{tmp}/model", "--output", "{tmp}/a-file"],
        "is a file, not a directory",
    ),
    ("master unknown scheme", ["train", "--master", "foo://"], "'foo://' is not a Spark master URL; use local"),
    (
        "master local[0]",
        ["evaluate", "--model", "{tmp}/model", "--master", "local[0]"],
        "'local[0]' is not a Spark master URL",
    ),
    ("master without port", ["train", "--master", "spark://localhost"], "'localhost' is not HOST:PORT"),
    (
        "master unreachable",
        ["train", "--master", "spark://127.0.0.1:{port}"],
        "cannot reach the master (127.0.0.1:{port}: Connection refused)",
    ),
    (
        "k8s master unreachable",
        ["predict", "--model", "{tmp}/model", "--output", "{tmp}/pred", "--master", "k8s://https://127.0.0.1:{port}"],
        "cannot reach the master",
    ),
    ("yarn without Hadoop config", ["train", "--master", "yarn"], "needs HADOOP_CONF_DIR or YARN_CONF_DIR"),
]


@pytest.mark.parametrize(("argv", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_output_or_master_exits_2_before_working(
    argv: list[str], fragment: str, where, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    started: list[str] = []
    monkeypatch.setattr(cli, "COMMANDS", {k: (lambda args, k=k: started.append(k) or 0) for k in cli.COMMANDS})
    before = sorted(os.listdir(where["tmp"]))
    assert cli.main([a.format(**where) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchspark: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert fragment.format(**where) in err
    assert started == []
    assert sorted(os.listdir(where["tmp"])) == before  # the probes left nothing behind


def test_good_arguments_pass_and_create_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        for argv in (
            ["train"],
            ["train", "--output", "new/deeper", "--master", "local-cluster[2,1,1024]"],
            ["train", "--master", f"spark://127.0.0.1:{_closed_port()},127.0.0.1:{port}"],  # HA: one is up
            ["evaluate", "--model", "m", "--output", "eval/out.json", "--master", "local[*]"],
            ["predict", "--model", "m", "--output", "pred", "--master", "local[2, 3]"],
            ["train", "--parallel", "--master", "foo://"],
        ):  # --parallel starts no Spark: master unused
            check_arguments(cli.build_parser().parse_args(argv))
    assert os.listdir(tmp_path) == []


def test_yarn_with_hadoop_config_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    check_master("yarn")
    with pytest.raises(ConfigError, match="not a Spark master URL"):
        check_master("mesos://host:5050")  # removed in Spark 4


_NO_SPARK = """
import json, sys
from torchspark.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "pyspark": sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j"))}))
"""


def test_the_command_line_fails_in_a_fresh_interpreter_without_starting_spark(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    proc = subprocess.run(
        [sys.executable, "-c", _NO_SPARK, "train", "--output", str(tmp_path / "a-file")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"rc": 2, "pyspark": []}
    assert proc.stderr.strip().splitlines() == [
        f"torchspark: error: --output {str(tmp_path / 'a-file')!r} is a file, not a directory; pass a directory path"
    ]
