"""The directory progress channel without Spark: workers' writers, the driver's poller, and the Connect route's
choice of channel (a pure policy)."""

from __future__ import annotations

import json
import os

import pytest

from torchspark.errors import ConfigError, SetupError
from torchspark.spark.connect.progress import ConnectProgress, choose_channel, progress_base
from torchspark.training.checkpoint import CheckpointPlan
from torchspark.training.driver.fit import FitContext
from torchspark.training.hooks import NullRecorder, ProgressUpdate, ScoreReport
from torchspark.training.progress import DirectoryProgressReader, DirectoryProgressWriter, ProgressDirectory
from torchspark.training.progress.files import chunk_name, parse_chunk_name
from torchspark.training.worker.reporting import open_worker_hooks


def _update(rank: int, epoch: int, examples: int) -> ProgressUpdate:
    return ProgressUpdate(rank=rank, epoch=epoch, iteration=examples // 4, examples=examples, score=0.5)


def test_chunk_names_sort_in_write_order_and_temporaries_are_not_chunks() -> None:
    names = [chunk_name(3, s) for s in (0, 9, 10, 123)]
    assert names == sorted(names)
    assert parse_chunk_name("s3://b/run/" + chunk_name(3, 10)) == (3, 10)
    assert parse_chunk_name(".rank-00003-000000010.jsonl.tmp-123") is None
    assert parse_chunk_name("notes.txt") is None


def test_what_two_writers_write_reaches_the_listeners_in_order(tmp_path) -> None:
    got, scores, errors = [], [], []
    reader = DirectoryProgressReader(
        str(tmp_path / "p"),
        poll_s=60.0,
        listeners=[got.append],
        score_listeners=[scores.append],
        error_listeners=[lambda r, tb: errors.append((r, tb))],
    ).start()
    writers = [DirectoryProgressWriter(reader.target, rank).connect() for rank in (0, 1)]
    for examples in (4, 8, 12):
        for w in writers:
            w.send(_update(w.rank, 0, examples))
    writers[0].send_score(ScoreReport(epoch=0, round=None, examples=24, score=0.25))
    writers[1].send_error("Traceback ...\nValueError: bad row 7")
    for w in writers:
        w.close()
    reader.close(drain_s=1.0)

    assert [(u.rank, u.examples) for u in got if u.rank == 0] == [(0, 4), (0, 8), (0, 12)]
    assert [(u.rank, u.examples) for u in got if u.rank == 1] == [(1, 4), (1, 8), (1, 12)]
    assert reader.total_examples() == 24
    assert scores == [ScoreReport(epoch=0, round=None, examples=24, score=0.25)]
    assert errors == [(1, "Traceback ...\nValueError: bad row 7")]
    assert reader.errors() == errors
    states = reader.liveness.snapshot()
    assert sorted(states) == [0, 1] and all(s.ended and s.pid == os.getpid() for s in states.values())
    assert (tmp_path / "p").is_dir()  # kept: not removed without remove=True


def test_heartbeats_keep_a_rank_alive_and_a_silent_one_is_named(tmp_path) -> None:
    now = [0.0]
    reader = DirectoryProgressReader(str(tmp_path / "p"), poll_s=60.0, clock=lambda: now[0]).start()
    writer = DirectoryProgressWriter(reader.target, 2).connect()
    reader.poll()
    assert reader.liveness.snapshot()[2].pid == os.getpid()
    assert reader.liveness.stalled(world_size=3, timeout_s=30.0) is None
    now[0] = 100.0  # the driver's clock moves on; rank 2 wrote nothing since
    lost = reader.liveness.stalled(world_size=3, timeout_s=30.0)
    assert lost is not None and lost.rank == 2 and "heartbeat" in str(lost)
    writer.close()
    reader.close()


def test_a_heartbeat_is_written_every_few_seconds_of_the_workers_clock(tmp_path) -> None:
    now = [0.0]
    target = ProgressDirectory(str(tmp_path), 60.0)
    writer = DirectoryProgressWriter(target, 0, clock=lambda: now[0]).connect()
    writer._flush()  # nothing buffered, heartbeat fresh: no chunk
    assert sorted(os.listdir(tmp_path)) == [chunk_name(0, 0)]
    now[0] = 2.5
    writer._flush()
    assert sorted(os.listdir(tmp_path)) == [chunk_name(0, 0), chunk_name(0, 1)]
    assert json.loads((tmp_path / chunk_name(0, 1)).read_text())["kind"] == "alive"
    writer.close()


def test_a_gap_waits_for_the_missing_chunk_and_garbage_is_counted(tmp_path) -> None:
    got = []
    reader = DirectoryProgressReader(str(tmp_path), poll_s=60.0, listeners=[got.append]).start()
    line = {"kind": "progress", "rank": 0, "epoch": 0, "iteration": 1, "examples": 4, "score": 1.0}
    (tmp_path / chunk_name(0, 1)).write_text(json.dumps(line) + "\n")
    assert reader.poll() == 0 and got == []  # chunk 0 is still being written
    (tmp_path / chunk_name(0, 0)).write_text("not json\n")
    assert reader.poll() == 2
    assert [u.examples for u in got] == [4] and reader.malformed_count() == 1
    reader.close(remove=True)
    assert not tmp_path.exists()


def test_a_writer_that_cannot_write_turns_itself_off(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    writer = DirectoryProgressWriter(ProgressDirectory(str(blocker / "sub")), 0).connect()
    assert not writer.active
    writer.send(_update(0, 0, 4))  # no-ops, never raises
    writer.send_error("boom")
    writer.close()


def test_worker_hooks_write_to_a_directory_when_given_one(tmp_path) -> None:
    target = ProgressDirectory(str(tmp_path), 60.0)
    hooks = open_worker_hooks(1, collect_stats=True, progress_address=target, report_scores=True)
    assert isinstance(hooks.progress, DirectoryProgressWriter)
    hooks.progress(_update(1, 0, 4))
    hooks.report_error("Traceback\nKeyError: 'x'")
    hooks.close()
    kinds = [
        json.loads(line)["kind"]
        for name in sorted(os.listdir(tmp_path))
        for line in (tmp_path / name).read_text().splitlines()
    ]
    assert kinds == ["alive", "progress", "error", "closed"]


def test_the_fit_context_opens_a_directory_per_attempt_and_removes_it_after_success(tmp_path) -> None:
    got = []
    ok = FitContext(None, NullRecorder(), "fit", listeners=[got.append])  # type: ignore[arg-type]
    target = ok.progress_directory(str(tmp_path), poll_s=60.0)
    assert target.url.startswith(str(tmp_path)) and target.url.endswith("-a0")
    with DirectoryProgressWriter(target, 0) as writer:
        writer.send(_update(0, 0, 8))
        writer.send_error("Traceback\nRuntimeError: worker 0 broke")
    assert ok.reported_errors() == [(0, "Traceback\nRuntimeError: worker 0 broke")]
    ok.close(drain_s=1.0, succeeded=True)
    assert [u.examples for u in got] == [8] and os.listdir(tmp_path) == []

    failed = FitContext(None, NullRecorder(), "fit", attempt=1)  # type: ignore[arg-type]
    kept = failed.progress_directory(str(tmp_path), poll_s=60.0)
    failed.close()
    assert kept.url.endswith("-a1") and os.path.isdir(kept.url)


@pytest.mark.parametrize(
    ("channel", "local", "base", "chosen"),
    [
        ("auto", True, None, "tcp"),
        ("auto", True, "s3://b/p", "tcp"),
        ("auto", False, "s3://b/p", "directory"),
        ("auto", False, None, "none"),
        ("tcp", False, None, "tcp"),
        ("directory", True, "/tmp/p", "directory"),
        ("none", True, None, "none"),
    ],
)
def test_the_channel_choice(channel, local, base, chosen) -> None:
    assert choose_channel(ConnectProgress(channel), local, base) == chosen


def test_auto_without_a_reachable_client_or_directory_warns_naming_the_setting(caplog) -> None:
    with caplog.at_level("WARNING"):
        assert choose_channel(ConnectProgress(), False, None) == "none"
    assert "progress_directory" in caplog.text


def test_the_default_directory_is_under_the_runs_checkpoints() -> None:
    plan = CheckpointPlan("s3://b/ckpt", "run1")
    assert progress_base(ConnectProgress(), plan) == "s3://b/ckpt/run1/progress"
    assert progress_base(ConnectProgress(directory="memory://p"), plan) == "memory://p"
    assert progress_base(ConnectProgress(), None) is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"channel": "grpc"}, "progress_channel must be one of"),
        ({"poll_s": 0}, "progress_poll_s must be a number of seconds"),
        ({"poll_s": "1"}, "progress_poll_s"),
        ({"directory": ""}, "progress_directory must be a non-empty URL"),
        ({"channel": "tcp", "directory": "s3://b/p"}, "unused with progress_channel='tcp'"),
    ],
)
def test_bad_settings_are_refused(kwargs, words) -> None:
    with pytest.raises(ConfigError, match=words):
        ConnectProgress(**kwargs)


def test_directory_without_a_location_names_both_ways_to_give_one() -> None:
    with pytest.raises(ConfigError, match="progress_directory=.*checkpoint_directory"):
        choose_channel(ConnectProgress("directory"), False, None)


def test_a_directory_that_cannot_be_made_fails_at_start(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SetupError, match="progress_directory"):
        DirectoryProgressReader(str(blocker / "sub")).start()


def test_a_spark_error_without_the_traceback_names_the_workers_reported_exception() -> None:
    """A Connect client can get Spark's error message cut short (no Python traceback in it): the traceback the
    worker wrote to the progress channel then names the cause."""
    from torchspark.spark.jobs import task_error

    cut = "Job aborted due to stage failure: Task 1 in stage 3.0 failed 1 times, most recent failure: ... (truncated)"
    reported = [
        (
            1,
            'Traceback (most recent call last):\n  File "model.py", line 9, in forward\n'
            "ValueError: row 17 has 3 features, expected 4",
        )
    ]
    error = task_error(Exception(cut), "fit", lambda: reported)
    assert "ValueError: row 17 has 3 features, expected 4" in str(error).splitlines()[0]
    assert "model.py" in str(error)
    assert "ValueError" not in str(task_error(Exception(cut), "fit", lambda: []))  # without a report: Spark's words
